"""accel.utils FSDP helpers (Accelerate's fsdp_utils names) on a real 2-process FSDP2 model."""

from __future__ import annotations

import os

import pytest
import torch
import utils_fsdp_workers

from accel.utils import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_canonicalize_names,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
)
from accel_state.testing import spawn_workers

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("fsdp_utils")
    return spawn_workers(utils_fsdp_workers.fsdp_utils_job, 2, args=(str(folder),), timeout=600)


def test_sharded_model_and_optimizer_round_trip_on_two_processes(launched):
    for rank in launched:
        result = rank["sharded"]
        assert result["model_path"] == "pytorch_model_fsdp_0"
        assert result["optim_path"] == "optimizer_0"
        assert result["files"] == ["optimizer_0", "pytorch_model_fsdp_0"]
        assert result["moved"]
        assert result["weights_restored"]
        assert result["optimizer_restored"]


def test_full_state_dict_model_and_optimizer_round_trip(launched):
    for rank in launched:
        result = rank["full"]
        assert result["files"] == ["optimizer.bin", "pytorch_model_fsdp.bin"]
        assert result["moved"]
        assert result["weights_restored"]
        assert result["optimizer_restored"]


def test_fsdp2_prepare_switch_load_full_and_activation_checkpointing(launched):
    for rank in launched:
        assert rank["fsdp2"] == {
            "is_fsdp_module": True,
            "has_dtensor": True,
            "optimizer_holds_shards": True,
            "full_state_loaded": True,
            "ac_wrapped": True,
            "canonical_names": True,
        }


def test_fsdp2_canonicalize_names_strips_wrapper_parts():
    names = {
        "_orig_mod.blocks.0._checkpoint_wrapped_module.qkv.weight": 1,
        "head._orig_mod.bias": 2,
        "embed.weight": 3,
    }
    assert fsdp2_canonicalize_names(names) == {
        "blocks.0.qkv.weight": 1,
        "head.bias": 2,
        "embed.weight": 3,
    }


def test_switch_optimizer_parameters_replaces_and_refuses_unknown():
    old = torch.nn.Linear(2, 2)
    new = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.1)
    mapping = {old.weight.data_ptr(): new.weight, old.bias.data_ptr: new.bias}
    fsdp2_switch_optimizer_parameters(optimizer, mapping)
    assert optimizer.param_groups[0]["params"] == [new.weight, new.bias]
    with pytest.raises(KeyError, match="no replacement"):
        fsdp2_switch_optimizer_parameters(optimizer, {})


def test_ram_efficient_loading_switches_set_the_transformers_variable(monkeypatch):
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
    enable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"
    disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"


def test_get_fsdp2_grad_scaler_scales_on_this_device():
    scaler = get_fsdp2_grad_scaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.scale(torch.ones(1)).item() == 8.0


def test_ensure_weights_retied_reties_after_each_module_init():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(4, 3, device="meta")
            self.head = torch.nn.Linear(3, 4, bias=False, device="meta")
            self.head.weight = self.embed.weight

    model = Tied()

    def init(module: torch.nn.Module) -> torch.nn.Module:
        return module.to_empty(device="cpu", recurse=False)

    assert ensure_weights_retied(init, torch.nn.Linear(2, 2), "cpu") is init  # nothing tied
    wrapped = ensure_weights_retied(init, model, "cpu")
    assert wrapped is not init
    wrapped(model.embed)  # materialises embed's weight only; head's must follow it
    assert model.head.weight is model.embed.weight
    assert model.head.weight.device.type == "cpu"
