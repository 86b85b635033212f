"""The XLA device (xla leg: torch_xla 2.9 with PJRT_DEVICE=CPU, one device).

Tests marked ``xla(min_devices=2)`` need a TPU VM; here they skip and say so.
"""

import os

import pytest
import xla_workers

from accel_state import (
    DeviceSelectionError,
    DistributedType,
    PartialState,
    XLAEnvironment,
    available_backends,
    select_backend,
)
from accel_state.cluster import resolve_cluster_environment
from accel_state.testing import spawn_xla_workers

pytestmark = [pytest.mark.xla, pytest.mark.usefixtures("xla_state")]


def test_one_process_state_on_the_xla_device():
    state = PartialState()
    assert state.device.type == "xla"
    assert state.distributed_type is DistributedType.XLA
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed and state.backend is None
    assert state.layout.source == "xla"
    assert "Distributed environment: DistributedType.XLA" in repr(state)
    state.wait_for_everyone()
    with state.main_process_first():
        pass
    with state.split_between_processes([1, 2, 3]) as mine:
        assert mine == [1, 2, 3]
    assert state.on_main_process(lambda: "ran")() == "ran"


def test_pjrt_device_selects_the_xla_environment():
    environment = resolve_cluster_environment(os.environ)
    assert environment is XLAEnvironment
    layout = XLAEnvironment.layout(os.environ)
    assert (layout.rank, layout.world_size, layout.local_world_size) == (0, 1, 1)


def test_xla_backend_goes_with_the_xla_device_only():
    device = PartialState().device
    assert "xla" in available_backends()
    assert select_backend(device) == "xla"
    with pytest.raises(DeviceSelectionError, match="needs a xla device"):
        select_backend(device.__class__("cpu"), "xla")


def test_cpu_flag_wins_over_pjrt_device():
    state = PartialState(cpu=True)
    assert state.device.type == "cpu"
    assert state.distributed_type is DistributedType.NO


def test_launcher_helper_runs_one_replica_per_device():
    results = spawn_xla_workers(xla_workers.replica_facts, timeout=240)
    count = len(results)
    for ordinal, facts in enumerate(results):
        assert facts["device"] == "xla" and facts["distributed_type"] == "XLA"
        assert (facts["process_index"], facts["num_processes"]) == (ordinal, count)
        assert facts["source"] == "xla" and facts["order"] == [ordinal]


@pytest.mark.xla(min_devices=2)
def test_replicas_form_one_job_over_the_xla_backend():
    results = spawn_xla_workers(xla_workers.replica_facts, timeout=600)
    count = len(results)
    assert count >= 2
    assert [facts["process_index"] for facts in results] == list(range(count))
    assert {facts["num_processes"] for facts in results} == {count}
    assert {facts["backend"] for facts in results} == {"xla"}
    assert {facts["group_backend"] for facts in results} == {"xla"}
    assert [facts["main"] for facts in results] == [True] + [False] * (count - 1)
