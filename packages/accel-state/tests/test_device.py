import pytest
import torch

from accel_state import (
    DeviceSelectionError,
    ProcessLayout,
    available_backends,
    select_backend,
    select_device,
)


def test_cpu_machine_picks_cpu_and_gloo():
    if torch.cuda.is_available():
        pytest.skip("this check is for CPU-only machines")
    device = select_device(ProcessLayout(world_size=2, local_world_size=2, rank=1, local_rank=1))
    assert device == torch.device("cpu")
    assert select_backend(device) == "gloo"
    assert "gloo" in available_backends()


def test_use_cpu_forces_cpu():
    assert select_device(ProcessLayout(), use_cpu=True).type == "cpu"


def test_unavailable_backend_names_value_and_choices():
    with pytest.raises(DeviceSelectionError) as raised:
        select_backend(torch.device("cpu"), "ccl-that-does-not-exist")
    assert "ccl-that-does-not-exist" in str(raised.value)
    assert "gloo" in str(raised.value)


@pytest.mark.cuda
def test_nccl_on_cpu_is_refused():
    with pytest.raises(DeviceSelectionError, match="needs a cuda device"):
        select_backend(torch.device("cpu"), "nccl")


def test_xla_requested_without_torch_xla(monkeypatch):
    import accel_state.device as device_module

    monkeypatch.setattr(device_module, "torch_xla_available", lambda: False)
    with pytest.raises(DeviceSelectionError, match="torch_xla is not installed"):
        select_device(ProcessLayout(), use_xla=True)


@pytest.mark.cuda
def test_cuda_device_follows_local_rank_and_uses_nccl():
    device = select_device(ProcessLayout())
    assert device == torch.device("cuda", 0)
    assert select_backend(device) == "nccl"


@pytest.mark.cuda
def test_more_local_processes_than_gpus_is_an_error():
    count = torch.cuda.device_count()
    layout = ProcessLayout(world_size=count + 1, local_world_size=count + 1)
    with pytest.raises(DeviceSelectionError, match="launch at most"):
        select_device(layout)


@pytest.mark.xla
def test_xla_device():
    device = select_device(ProcessLayout(), use_xla=True)
    assert device.type == "xla"
    assert select_backend(device) == "xla"
