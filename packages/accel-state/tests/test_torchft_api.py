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


def test_without_torchft_a_replica_manager_names_the_extra(monkeypatch) -> None:
    from accel_state.torchft_api import create_replica_manager

    monkeypatch.setitem(sys.modules, "torchft", None)
    with pytest.raises(FaultToleranceUnavailableError, match=r"accel\[ft\]"):
        create_replica_manager(
            device_type="cpu",
            group_rank=0,
            group_size=1,
            replica_id=0,
            min_replicas=1,
            lighthouse="http://127.0.0.1:1",
            timeout_s=1,
            quorum_timeout_s=1,
            connect_timeout_s=1,
            state_dict=dict,
            load_state_dict=print,
        )


def test_quiet_logs_keep_a_users_rust_log() -> None:
    from accel_state.torchft_api import quiet_torchft_logs

    assert quiet_torchft_logs({})["RUST_LOG"] == "warn"
    assert quiet_torchft_logs({"RUST_LOG": "info"})["RUST_LOG"] == "info"
