"""Fixtures of the fault-tolerance tests (tests-integration/ft)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accel_state.testing.environ import without_launcher_variables

#: torchft's timeouts for these jobs (seconds): collectives and commits, and quorums. Long
#: enough for a relaunch on 2 busy cores (a process start, imports, a quorum, a heal); the
#: tests of a job that must stop use a shorter quorum timeout (:data:`SHORT_QUORUM_TIMEOUT_SEC`).
TIMEOUT_SEC = 20
QUORUM_TIMEOUT_SEC = 60
SHORT_QUORUM_TIMEOUT_SEC = 20


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A job's environment: nothing from an outer launch, short torchft timeouts."""
    values = without_launcher_variables(os.environ)
    values.update(
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
        TORCHFT_TIMEOUT_SEC=str(TIMEOUT_SEC),
        TORCHFT_QUORUM_TIMEOUT_SEC=str(QUORUM_TIMEOUT_SEC),
    )
    return values
