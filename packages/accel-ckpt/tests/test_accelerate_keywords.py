"""Keyword arguments by Accelerate 1.15's names: set_module_tensor_to_device, load_offloaded_weight."""

from __future__ import annotations

import torch
from torch import nn

from accel_ckpt.big_modeling import (
    load_offloaded_weight,
    offload_weight,
    set_module_tensor_to_device,
)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 3, bias=False)
        self.head = nn.Linear(3, 3, bias=False)
        self.head.weight = self.embed.weight


def test_tied_params_map_places_tied_weights_once_per_device():
    model = _Tied()
    value = torch.arange(9.0).reshape(3, 3)
    tied_params_map: dict[int, dict[object, torch.Tensor]] = {value.data_ptr(): {}}
    set_module_tensor_to_device(
        model, "embed.weight", "meta", value=value, tied_params_map=tied_params_map
    )
    placed = tied_params_map[value.data_ptr()]["meta"]
    assert model.embed.weight is placed
    set_module_tensor_to_device(
        model, "head.weight", "meta", value=value, tied_params_map=tied_params_map
    )
    assert model.head.weight is placed  # the recorded tensor is reused, not a second copy
    untied = _Tied()
    set_module_tensor_to_device(untied, "embed.weight", "meta", value=value)
    set_module_tensor_to_device(untied, "head.weight", "meta", value=value)
    assert untied.head.weight is not untied.embed.weight  # without the map: two tensors


def test_fp16_statistics_become_the_parameter_scb_and_non_blocking_copies():
    model = nn.Linear(2, 2)
    statistics = torch.tensor([0.5, 2.0], dtype=torch.float16)
    value = torch.ones(2, 2)
    set_module_tensor_to_device(
        model,
        "weight",
        "cpu",
        value=value,
        fp16_statistics=statistics,
        non_blocking=True,
        clear_cache=False,
    )
    assert torch.equal(model.weight.SCB, statistics)
    assert torch.equal(model.weight.detach(), value)
    set_module_tensor_to_device(model, "bias", "cpu", value=torch.zeros(2), clear_cache=True)
    assert torch.equal(model.bias.detach(), torch.zeros(2))  # cpu: no cache to clear


def test_load_offloaded_weight_takes_weight_file_by_keyword(tmp_path):
    weight = torch.arange(6.0).reshape(2, 3)
    index = offload_weight(weight, "w", tmp_path)
    loaded = load_offloaded_weight(weight_file=tmp_path / "w.dat", weight_info=index["w"])
    assert torch.equal(loaded, weight)
