import os

import pytest

from accel_state import reset_state

LAUNCH_VARIABLES = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PJRT_DEVICE",
]


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Every in-process test starts as a plain single process with no shared state."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("ACCEL_"):
            monkeypatch.delenv(name)
    reset_state()
    yield
    reset_state()
