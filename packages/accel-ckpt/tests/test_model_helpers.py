"""Accelerate's lower-level model helpers (accel_ckpt.big_modeling.model_helpers), one process."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from safetensors.torch import save_file

from accel_ckpt.big_modeling import (
    cpu_offload,
    find_tied_parameters,
    init_empty_weights,
    offload_state_dict,
)
from accel_ckpt.big_modeling.model_helpers import (
    align_module_device,
    calculate_maximum_sizes,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    clean_state_dict_for_safetensors,
    extract_submodules_state_dict,
    get_module_children_bottom_up,
    id_tensor_storage,
    load_offloaded_weights,
    load_state_dict,
    retie_parameters,
)
from accel_ckpt.big_modeling.offload import read_offload_index


class TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight


def test_load_state_dict_reads_safetensors_onto_mapped_devices_and_torch_files(tmp_path):
    weights = {"a.weight": torch.arange(6.0).view(2, 3), "b.bias": torch.ones(2)}
    save_file(weights, tmp_path / "model.safetensors")
    loaded = load_state_dict(tmp_path / "model.safetensors", device_map={"a": "meta", "b": "disk"})
    assert loaded["a.weight"].device.type == "meta"  # mapped device honoured
    assert torch.equal(loaded["b.bias"], weights["b.bias"])  # "disk" reads onto the CPU
    assert torch.equal(
        load_state_dict(str(tmp_path / "model.safetensors"))["a.weight"], weights["a.weight"]
    )
    torch.save(weights, tmp_path / "pytorch_model.bin")
    assert torch.equal(load_state_dict(tmp_path / "pytorch_model.bin")["b.bias"], torch.ones(2))
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        load_state_dict(tmp_path / "missing.safetensors")


def test_clean_state_dict_drops_shared_storage_so_safetensors_can_write_it(tmp_path, caplog):
    model = TiedLM()
    state = model.state_dict()
    assert id_tensor_storage(state["embed.weight"]) == id_tensor_storage(state["head.weight"])
    assert id_tensor_storage(state["embed.weight"]) != id_tensor_storage(state["body.0.weight"])
    with caplog.at_level(logging.WARNING, logger="accel.utils.other"):
        cleaned = clean_state_dict_for_safetensors(state)
    assert "Removed shared tensor" in caplog.text and "head.weight" in caplog.text
    assert "head.weight" not in cleaned and "embed.weight" in cleaned
    save_file(cleaned, tmp_path / "model.safetensors")  # refuses shared tensors otherwise

    # The everyday reload: empty model, load, retie.
    with init_empty_weights():
        fresh = TiedLM()
    tied = find_tied_parameters(TiedLM())
    fresh.load_state_dict(
        load_state_dict(tmp_path / "model.safetensors"), strict=False, assign=True
    )
    assert fresh.head.weight.device.type == "meta"
    retie_parameters(fresh, tied)
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.head.weight, model.embed.weight)


def test_retie_leaves_an_all_meta_group_alone():
    with init_empty_weights():
        model = TiedLM()
    model.head.weight = torch.nn.Parameter(torch.empty(8, 4, device="meta"))
    retie_parameters(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is not model.embed.weight


def test_tied_parameter_checks():
    assert check_tied_parameters_in_config(TiedLM()) is False  # not a transformers model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_tied_parameters_on_same_device([["embed.weight", "head.weight"]], {"": "cpu"})
    with pytest.warns(UserWarning, match="different devices"):
        check_tied_parameters_on_same_device(
            [["embed.weight", "head.weight"]], {"embed": "cpu", "body": "cpu", "head": "disk"}
        )


def test_extract_submodules_and_bottom_up_order():
    state = {"body.0.weight": 1, "body.0.bias": 2, "body_extra.w": 3, "head.weight": 4}
    assert extract_submodules_state_dict(state, ["body"]) == {"body.0.weight": 1, "body.0.bias": 2}
    model = TiedLM()
    order = get_module_children_bottom_up(model, return_fqns=True)
    names = [name for name, _ in order]
    assert names[-1] == "" and order[-1][1] is model
    for name in names:  # every module comes after all of its descendants
        assert all(
            names.index(other) < names.index(name)
            for other in names
            if other.startswith(name + ".") and name
        )
    assert len(get_module_children_bottom_up(model)) == len(list(model.modules()))


def test_load_offloaded_weights_puts_disk_weights_back(tmp_path):
    model = torch.nn.Linear(3, 2)
    offload_state_dict(tmp_path, model.state_dict())
    index = read_offload_index(tmp_path)
    with init_empty_weights():
        empty = torch.nn.Linear(3, 2)
    load_offloaded_weights(empty, index, tmp_path)
    assert torch.equal(empty.weight, model.weight) and torch.equal(empty.bias, model.bias)
    load_offloaded_weights(empty, {}, tmp_path)  # nothing to do


def test_calculate_maximum_sizes_total_and_largest_layer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 16))
    total, (largest, names) = calculate_maximum_sizes(model)
    assert total == (20 + 80) * 4
    assert largest == 80 * 4 and names == ["1"]


def test_align_module_device_moves_and_restores_and_loads_offloaded_weights():
    layer = torch.nn.Linear(2, 2)
    before = layer.weight.detach().clone()
    with align_module_device(layer, torch.device("meta")):
        assert layer.weight.device.type == "meta"
    assert layer.weight.device.type == "cpu"
    assert torch.equal(layer.weight, before)  # the data comes back too
    with align_module_device(layer):  # nothing to do
        assert layer.weight.device.type == "cpu"

    offloaded = torch.nn.Linear(2, 2)
    expected = offloaded.weight.detach().clone()
    cpu_offload(offloaded, execution_device="cpu")
    assert offloaded.weight.device.type == "meta"
    with align_module_device(offloaded):
        assert torch.equal(offloaded.weight, expected)
    assert offloaded.weight.device.type == "meta"


def test_offloaded_weights_are_found_inside_nested_sequential_hooks():
    from accel_ckpt.big_modeling.hooks import (
        AlignDevicesHook,
        ModelHook,
        add_hook_to_module,
        offloading_hook,
    )

    offloaded = torch.nn.Linear(2, 2)
    expected = offloaded.weight.detach().clone()
    cpu_offload(offloaded, execution_device="cpu")
    align = offloading_hook(offloaded)
    assert isinstance(align, AlignDevicesHook) and align.offload
    add_hook_to_module(offloaded, ModelHook(), append=True)  # SequentialHook(align, other)
    add_hook_to_module(offloaded, ModelHook(), append=True)  # nested one level deeper
    assert type(offloaded._hf_hook.hooks[0]).__name__ == "SequentialHook"
    assert offloading_hook(offloaded) is align
    with align_module_device(offloaded):
        assert torch.equal(offloaded.weight, expected)
    assert offloaded.weight.device.type == "meta"
    assert offloading_hook(torch.nn.Linear(2, 2)) is None
