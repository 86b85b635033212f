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


@pytest.fixture
def clean_state(monkeypatch):
    """A single plain process with no launcher variables and no leftover shared state."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in list(__import__("os").environ):
        if name.startswith("ACCEL_"):
            monkeypatch.delenv(name)
    reset_state()
    yield
    reset_state()
