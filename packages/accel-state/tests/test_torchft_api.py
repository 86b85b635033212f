"""accel_state.torchft_api without torchft: the error names the extra to install."""

from __future__ import annotations

import sys

import pytest

from accel_state.errors import FaultToleranceUnavailableError
from accel_state.torchft_api import TORCHFT_REQUIREMENT, start_lighthouse


def test_without_torchft_starting_a_lighthouse_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)  # as if not installed
    with pytest.raises(FaultToleranceUnavailableError) as error:
        start_lighthouse("127.0.0.1", 0, min_replicas=1)
    message = str(error.value)
    assert "pip install 'accel-launch[ft]'" in message and TORCHFT_REQUIREMENT in message
    assert isinstance(error.value, ImportError)
