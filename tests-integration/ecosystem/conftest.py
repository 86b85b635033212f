"""The session's shared job runner for the ecosystem tests (see ecosystem_jobs.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import reference
from ecosystem_jobs import BASELINE_PYTHON_ENV, RECORD_ENV, JobRunner


@pytest.fixture(scope="session")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobRunner]:
    """The session's job runner (see :class:`JobRunner`).

    Accelerate's side runs live in ``$ACCEL_ECOSYSTEM_BASELINE_PYTHON`` when it is set (and is
    then written to ``$ACCEL_ECOSYSTEM_RECORD`` if that is set too), else it is replayed from the
    committed record.
    """
    baseline = os.environ.get(BASELINE_PYTHON_ENV) or None
    record_to = os.environ.get(RECORD_ENV)
    if record_to and not baseline:
        raise pytest.UsageError(
            f"{RECORD_ENV} records Accelerate's side: set {BASELINE_PYTHON_ENV}"
        )
    runner = JobRunner(
        tmp_path_factory.mktemp("ecosystem"),
        baseline_python=baseline,
        record_file=Path(record_to) if record_to else reference.RESULTS_FILE,
    )
    yield runner
    if record_to and baseline:
        printed = subprocess.run(
            [baseline, str(Path(reference.__file__)), "environment"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        count = runner.write_record(json.loads(printed))
        print(f"\necosystem reference: wrote {count} Accelerate jobs' results to {record_to}")
