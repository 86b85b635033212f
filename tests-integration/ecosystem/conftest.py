"""The session's shared job runner for the ecosystem tests (see ecosystem_jobs.py)."""

from __future__ import annotations

import pytest
from ecosystem_jobs import JobRunner


@pytest.fixture(scope="session")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> JobRunner:
    """The session's job runner (see :class:`JobRunner`)."""
    return JobRunner(tmp_path_factory.mktemp("ecosystem"))
