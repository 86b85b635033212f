import pytest


@pytest.fixture(autouse=True)
def clean_state(single_process_state):
    """Every in-process test runs as a plain single process with fresh shared state."""
