"""Behaviour Accelerate's own unit suite checks on the big-model code, on real modules."""

from __future__ import annotations

import json
import logging
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_ckpt import load_checkpoint_in_model, save, save_model
from accel_ckpt.big_modeling import (
    attach_layerwise_casting_hooks,
    check_device_map,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    set_module_tensor_to_device,
)
from accel_ckpt.big_modeling.casting import _refuse_recurrent_layers_under_sequence_parallelism
from accel_ckpt.big_modeling.model_helpers import (
    compute_module_total_buffer_size,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    get_state_dict_offloaded_model,
)
from accel_ckpt.sizes import parse_size


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.batchnorm(self.linear1(x)))


def test_tied_module_is_split_so_the_module_stays_on_one_device() -> None:
    model = nn.Sequential(OrderedDict([(f"layer{i}", Small()) for i in (1, 2, 3)]))
    model.layer3.linear2.weight = model.layer1.linear2.weight
    plan = infer_auto_device_map(model, max_memory={0: 400, 1: 500})
    assert plan == {
        "layer1": 0,
        "layer3.linear2": 0,
        "layer2": 1,
        "layer3.linear1": 1,
        "layer3.batchnorm": 1,
    }


def test_offloaded_buffers_that_fit_no_gpu_warn_unless_offloaded() -> None:
    model = Small()
    model.batchnorm.register_buffer("extra", torch.zeros(10, 3))
    model.linear2.register_buffer("extra", torch.zeros(10, 3))
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        infer_auto_device_map(model, max_memory={0: 400, "cpu": "1GB"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer_auto_device_map(model, max_memory={0: 400, "cpu": "1GB"}, offload_buffers=True)


def test_fallback_allocation_fills_an_empty_device(caplog: pytest.LogCaptureFixture) -> None:
    inner = nn.Sequential(
        OrderedDict([("a", nn.Linear(10, 4)), ("b", nn.Linear(4, 4)), ("c", nn.Linear(4, 8))])
    )
    model = nn.Sequential(OrderedDict([("module", inner)]))
    with caplog.at_level(logging.INFO, logger="accel.utils.modeling"):
        plan = infer_auto_device_map(model, max_memory={0: 256})
    assert 0 not in plan.values() and "insufficient memory" in caplog.text
    plan = infer_auto_device_map(model, max_memory={0: 256}, fallback_allocation=True)
    assert plan == {"module.a": "disk", "module.b": 0, "module.c": "disk"}


def test_size_helpers() -> None:
    model = Small()
    assert compute_module_total_buffer_size(model) == 4 * 4 * 2 + 8
    model.register_buffer("scratch", torch.zeros(2), persistent=False)
    assert get_non_persistent_buffers(model) == {"scratch"}
    modules = list(model.named_children())
    sizes = {"linear1": 64, "linear2": 100, "linear2.weight": 80}
    assert get_module_size_with_ties(["linear2.weight"], 64, sizes, modules[1:]) == (
        84,
        ["linear2"],
        [model.linear2],
    )
    assert parse_size("0MB", allow_zero=True) == 0


def test_unknown_device_map_keys_warn_in_check_and_raise_in_dispatch() -> None:
    model = Small()
    with pytest.warns(UserWarning, match="do not match any submodules.*'nope'"):
        check_device_map(model, {"": "cpu", "nope": 0})
    with pytest.raises(ValueError, match="closest names"):
        dispatch_model(model, {"": "cpu", "linear": "cpu"})


def test_bare_index_and_unused_weights_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = Small()
    state = source.state_dict()
    torch.save({k: v for k, v in state.items() if k.startswith("linear")}, tmp_path / "a.bin")
    torch.save({k: v for k, v in state.items() if k.startswith("batchnorm")}, tmp_path / "b.bin")
    index = {k: "a.bin" if k.startswith("linear") else "b.bin" for k in state}
    (tmp_path / "bare.index.json").write_text(json.dumps(index))
    model = Small()
    load_checkpoint_in_model(model, tmp_path / "bare.index.json")
    assert torch.equal(model.linear2.weight, source.linear2.weight)
    torch.save({**state, "foo": torch.ones(1)}, tmp_path / "extra.bin")
    with caplog.at_level(logging.WARNING, logger="accel.utils.modeling"):
        load_checkpoint_in_model(Small(), tmp_path / "extra.bin")
    assert "were not used when initializing Small" in caplog.text


def test_save_model_gathers_disk_offloaded_weights(tmp_path: Path) -> None:
    model = Small().eval()
    x = torch.randn(3, 3)
    expected = model(x)
    save_model(model, tmp_path)
    device_map = {"linear1": "cpu", "batchnorm": "disk", "linear2": "cpu"}
    load_checkpoint_and_dispatch(model, tmp_path, device_map=device_map, offload_folder=tmp_path)
    assert model.batchnorm.weight.device.type == "meta"
    assert set(get_state_dict_offloaded_model(model)) == set(Small().state_dict())
    save_model(model, tmp_path / "again")
    fresh = Small().eval()
    load_checkpoint_in_model(fresh, tmp_path / "again")
    torch.testing.assert_close(fresh(x), expected)


def test_disk_only_map_dispatches_with_hooks(tmp_path: Path) -> None:
    model = Small().eval()
    x = torch.randn(2, 3)
    expected = model(x)
    dispatch_model(
        model, {"linear1": "disk", "batchnorm": "disk", "linear2": "disk"}, offload_dir=tmp_path
    )
    torch.testing.assert_close(model(x), expected)


def test_safetensors_save_of_shared_tensors_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layer = nn.Linear(4, 4)
    state = {"a.weight": layer.weight, "b.weight": layer.weight}
    with caplog.at_level(logging.WARNING):
        save(state, tmp_path / "model.safetensors", safe_serialization=True, is_main_process=True)
    assert [r.name for r in caplog.records] == ["accel.utils.other"]
    assert "Removed shared tensor" in caplog.text


def test_layerwise_casting_and_empty_init_and_shape_error() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
    assert model[0].weight.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32
    assert model(torch.randn(2, 4)).dtype == torch.float32
    assert model[0].weight.dtype == torch.bfloat16
    register = nn.Module.register_parameter
    with init_empty_weights(include_buffers=True):
        assert nn.Module.register_parameter is register
        norm = nn.BatchNorm1d(4)
    assert norm.running_mean.device.type == "meta"
    with pytest.raises(ValueError, match=r'Trying to set a tensor of shape .* in "weight"'):
        set_module_tensor_to_device(Small(), "linear1.weight", "cpu", value=torch.zeros(2, 2))


def test_recurrent_layers_are_refused_under_sequence_parallelism() -> None:
    model = Small()
    model.config = type("Config", (), {"layer_types": ["full_attention", "linear_attention"]})()  # type: ignore[assignment]
    with pytest.raises(ValueError, match="linear_attention"):
        _refuse_recurrent_layers_under_sequence_parallelism(model)


# ---------------------------------------------------------------------------- fallback_allocate
def test_fallback_allocate_splits_breadth_first_to_find_a_fitting_module():
    from torch import nn

    from accel_ckpt.big_modeling.planning import compute_module_sizes, fallback_allocate

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.Linear(16, 16)  # 272 floats
            self.small = nn.Linear(4, 4)  # 20 floats

    model = nn.Sequential(Block(), nn.Linear(2, 2))
    sizes = compute_module_sizes(model)
    modules = list(model.named_children())
    name, module, rest = fallback_allocate(modules, sizes, 100)
    assert name == "0.small" and module is model[0].small
    assert [n for n, _ in rest] == ["0.big", "1"]  # block 0 was split into its parts
    # Nothing fits: the list comes back unchanged; unsplittable classes are not searched into.
    assert fallback_allocate(modules, sizes, 10) == (None, None, modules)
    name, _, _ = fallback_allocate(modules, sizes, 100, no_split_module_classes=["Block"])
    assert name == "1"
    assert fallback_allocate(modules, sizes, "2KB")[0] == "0"
    with pytest.raises(ValueError, match="size_limit"):
        fallback_allocate(modules, sizes, "lots")


def test_fallback_allocate_counts_tied_modules_with_the_candidate():
    from torch import nn

    from accel_ckpt.big_modeling.planning import compute_module_sizes, fallback_allocate

    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(2, 2, bias=False), nn.Linear(8, 8))
    model[2].weight = model[0].weight  # module 2 brings its 32-byte bias along with module 0
    sizes = compute_module_sizes(model)
    modules = list(model.named_children())
    tied = [["0.weight", "2.weight"]]
    assert fallback_allocate(modules, sizes, 256)[0] == "0"
    assert fallback_allocate(modules, sizes, 256, tied_parameters=tied)[0] == "1"
    assert fallback_allocate(modules, sizes, 288, tied_parameters=tied)[0] == "0"


def test_get_max_memory_converts_the_callers_size_strings_in_place() -> None:
    # transformers' from_pretrained(max_memory=...) compares the caller's dict with the result.
    from accel_ckpt.big_modeling import get_max_memory

    given: dict[object, int | str] = {"cpu": "150KB", "disk": 10**9}
    result = get_max_memory(given)
    assert given == {"cpu": 150_000, "disk": 10**9}
    assert result == {"cpu": 150_000, "disk": 10**9}
    frozen = {"cpu": "1KB"}
    assert get_max_memory(frozen.items().mapping) == {"cpu": 1000}  # read-only: not touched
    assert frozen == {"cpu": "1KB"}


def test_offload_index_entries_into_safetensors_files_are_read_and_cast(tmp_path: Path) -> None:
    # transformers 5 indexes disk-offloaded weights that stay in the checkpoint it loads from.
    from safetensors.torch import save_file

    from accel_ckpt.big_modeling.offload import OffloadedWeightsLoader, offload_weight

    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    save_file({"model.w": weight}, str(tmp_path / "model.safetensors"))
    index: dict[str, dict[str, object]] = {
        "w_bf16": {
            "safetensors_file": str(tmp_path / "model.safetensors"),
            "weight_name": "model.w",
            "dtype": "bfloat16",
        },
        "w_same": {
            "safetensors_file": str(tmp_path / "model.safetensors"),
            "weight_name": "model.w",
        },
    }
    offload_weight(weight * 2, "w_dat", tmp_path / "offload", index)
    loader = OffloadedWeightsLoader(save_folder=tmp_path / "offload", index=index)
    assert loader["w_bf16"].dtype == torch.bfloat16
    assert torch.equal(loader["w_bf16"], weight.to(torch.bfloat16))
    assert torch.equal(loader["w_same"], weight)
    assert torch.equal(loader["w_dat"], weight * 2)
    assert sorted(loader) == ["w_bf16", "w_dat", "w_same"]


def test_offload_index_into_a_missing_or_wrong_safetensors_file_says_so(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from accel_ckpt.big_modeling.offload import OffloadedWeightsLoader
    from accel_ckpt.errors import CheckpointNotFoundError, CorruptCheckpointError

    save_file({"a": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    entries = {
        "gone": {"safetensors_file": str(tmp_path / "moved.safetensors"), "weight_name": "a"},
        "misnamed": {"safetensors_file": str(tmp_path / "model.safetensors"), "weight_name": "b"},
    }
    loader = OffloadedWeightsLoader(index=entries)
    with pytest.raises(CheckpointNotFoundError, match=r"'gone' points into .*moved.safetensors"):
        loader["gone"]
    with pytest.raises(CorruptCheckpointError, match=r"maps 'misnamed' to 'b'.*no such tensor"):
        loader["misnamed"]


def test_offloading_hook_records_every_tensors_original_device(tmp_path: Path) -> None:
    """PEFT's ``onload_layer`` reads ``original_devices`` to tell disk-offloaded layers apart."""
    from accel_ckpt.big_modeling.hooks import AlignDevicesHook, add_hook_to_module

    model = Small()
    kept = AlignDevicesHook(execution_device="cpu", offload=False)
    add_hook_to_module(model.linear1, kept)
    assert kept.original_devices == {}
    offloading = AlignDevicesHook(execution_device="cpu", offload=True)
    add_hook_to_module(model.batchnorm, offloading)
    names = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}
    assert offloading.original_devices == {name: torch.device("cpu") for name in names}
    model = Small()
    dispatch_model(
        model, {"linear1": "cpu", "batchnorm": "cpu", "linear2": "disk"}, offload_dir=tmp_path
    )
    on_disk = model.linear2._hf_hook
    assert on_disk.original_devices == {"weight": torch.device("cpu"), "bias": torch.device("cpu")}
    assert hasattr(on_disk.weights_map, "dataset")  # PEFT finds the offload index through it
