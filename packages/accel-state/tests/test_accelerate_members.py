"""Accelerate's enum strings and the PartialState / GradientState members scripts use."""

from __future__ import annotations

import pytest
import torch
import workers

from accel_state import ComputeEnvironment, DistributedType, GradientState, PartialState, RNGType
from accel_state.testing import spawn_workers


def test_named_enums_print_as_class_and_member_but_compare_as_their_value():
    assert str(DistributedType.NO) == "DistributedType.NO"
    assert f"{DistributedType.FSDP}" == "DistributedType.FSDP"
    assert DistributedType.FSDP == "FSDP"
    assert str(ComputeEnvironment.LOCAL_MACHINE) == "ComputeEnvironment.LOCAL_MACHINE"
    assert ComputeEnvironment.LOCAL_MACHINE == "LOCAL_MACHINE"
    assert ComputeEnvironment.list() == ["LOCAL_MACHINE", "AMAZON_SAGEMAKER"]


def test_rng_type_has_every_accelerate_member():
    for name in ("MLU", "SDAA", "MUSA", "HPU", "NEURON"):
        assert RNGType[name].value == name.lower()
        assert str(RNGType[name]) == name.lower()


def test_default_device_fork_launched_and_set_device_on_cpu(monkeypatch):
    state = PartialState(cpu=True)
    assert state.default_device == torch.device("cpu")  # no accelerator is visible in CI
    monkeypatch.delenv("FORK_LAUNCHED", raising=False)
    assert state.fork_launched is False
    monkeypatch.setenv("FORK_LAUNCHED", "1")
    assert state.fork_launched is True
    state.set_device()  # a CPU device: nothing to make current
    assert state.device.type == "cpu"


def test_dataloader_references_start_with_none_and_end_with_the_active_loader():
    gradient_state = GradientState()
    assert gradient_state.dataloader_references == [None]
    outer, inner = [1, 2], [3]

    class Loader(list[int]):
        pass

    outer_loader, inner_loader = Loader(outer), Loader(inner)
    gradient_state.add_dataloader(outer_loader)
    gradient_state.add_dataloader(inner_loader)
    assert gradient_state.dataloader_references == [None, outer_loader, inner_loader]
    assert gradient_state.dataloader_references[-1] is gradient_state.active_dataloader
    gradient_state.remove_dataloader(inner_loader)
    gradient_state.remove_dataloader(outer_loader)
    assert gradient_state.dataloader_references == [None]
    # Accelerate's private spellings, which transformers and Accelerate's tests call.
    gradient_state._add_dataloader(outer_loader)
    assert gradient_state.active_dataloader is outer_loader
    gradient_state._remove_dataloader(outer_loader)
    gradient_state._set_sync_gradients(False)
    assert gradient_state.sync_gradients is False
    gradient_state._set_sync_gradients(True)


@pytest.mark.timeout(120)
def test_members_on_two_processes():
    results = spawn_workers(workers.accelerate_members, 2, timeout=120)
    assert [r["repr_type"] for r in results] == ["DistributedType.MULTI_CPU"] * 2
    assert [r["value"] for r in results] == ["MULTI_CPU"] * 2
    assert [r["default_device"] for r in results] == ["cpu"] * 2


def test_str_to_bool_returns_an_int_unless_to_bool():
    from accel_state import str_to_bool

    assert str_to_bool("yes") == 1 and type(str_to_bool("yes")) is int
    assert str_to_bool("off") == 0 and type(str_to_bool("off")) is int
    assert str_to_bool("True", to_bool=True) is True
    assert str_to_bool("0", to_bool=True) is False
