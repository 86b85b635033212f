import os

import pytest

from accel_state import reset_state

LAUNCH_VARIABLES = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMI_RANK",
    "PJRT_DEVICE",
]


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """Every in-process test runs as a plain single process with fresh shared state."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("ACCEL_"):
            monkeypatch.delenv(name)
    reset_state()
    yield
    reset_state()
