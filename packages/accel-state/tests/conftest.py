import pytest


@pytest.fixture
def clean_state(single_process_state):
    """A single plain process with no launcher variables and no leftover shared state."""
