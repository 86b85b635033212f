"""Big-model inference: empty init, device-map planning, offloaded loading and dispatch hooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from big_model_helpers import Block, Stack, TinyLM
from safetensors.torch import save_file
from torch import nn

from accel_ckpt import (
    DeviceMapError,
    DispatchedModelError,
    InsufficientMemoryError,
    StateDictMismatchError,
    compute_module_sizes,
    cpu_offload,
    disk_offload,
    dispatch_model,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    save_model,
)
from accel_ckpt.big_modeling import (
    ModelHook,
    add_hook_to_module,
    offload_state_dict,
    remove_hook_from_module,
    remove_hook_from_submodules,
    set_module_tensor_to_device,
)

NO_SPLIT = ["Block"]
# TinyLM(vocab=100, width=16, depth=4) in float32: embed (tied to head) 6400 bytes, each Block
# 8640 (ln 128, fc1 4352, fc2 4160), norm 128, the "scale" buffer 64: 41152 in all.
EMBED, BLOCK, TOTAL = 6400, 8640, 41152


@pytest.fixture
def trained() -> tuple[TinyLM, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        return model, ids, model(ids)


def empty_lm() -> TinyLM:
    with init_empty_weights():
        return TinyLM().eval()


def test_init_empty_weights_puts_parameters_on_meta_and_restores_torch() -> None:
    with init_empty_weights():
        model = TinyLM()
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.scale.device.type == "cpu" and torch.equal(model.scale, torch.ones(16))
    assert model.head.weight is model.embed.weight
    with init_empty_weights(include_buffers=True):
        with_buffers = TinyLM()
        assert torch.zeros(3).device.type == "meta"
    assert with_buffers.scale.device.type == "meta"
    assert torch.zeros(3).device.type == "cpu" and nn.Linear(2, 2).weight.device.type == "cpu"
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_module_sizes_and_tied_parameters() -> None:
    model = empty_lm()
    sizes = compute_module_sizes(model)
    assert (sizes[""], sizes["embed"], sizes["blocks.0"], sizes["head"]) == (TOTAL, EMBED, BLOCK, 0)
    assert compute_module_sizes(model, dtype=torch.float16)["blocks.0.fc1"] == 4352 // 2
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]


@pytest.mark.parametrize(
    ("max_memory", "no_split", "expected"),
    [
        ({"cpu": 100_000}, NO_SPLIT, {"": "cpu"}),
        # cpu keeps room for one Block (8640): 21360 left holds embed+head and blocks.0.
        (
            {"cpu": 30_000},
            NO_SPLIT,
            {
                "embed": "cpu",
                "blocks.0": "cpu",
                "blocks.1": "disk",
                "blocks.2": "disk",
                "blocks.3": "disk",
                "norm": "disk",
                "head": "cpu",
                "scale": "disk",
            },
        ),
        # Blocks may split: once embed is placed the largest layer left is an fc1 (4352), so
        # blocks.0 and blocks.1 fit and blocks.2 is cut after its LayerNorm (as in Accelerate).
        (
            {"cpu": 30_000},
            None,
            {
                "embed": "cpu",
                "blocks.0": "cpu",
                "blocks.1": "cpu",
                "blocks.2.ln": "cpu",
                "blocks.2.fc1": "disk",
                "blocks.2.fc2": "disk",
                "blocks.3": "disk",
                "norm": "disk",
                "head": "cpu",
                "scale": "disk",
            },
        ),
        # GPU 0 keeps room for a Block; GPU 1 (not a main device) fills up; the rest fits on cpu.
        (
            {0: 20_000, 1: 20_000, "cpu": 100_000},
            NO_SPLIT,
            {
                "embed": 0,
                "blocks.0": 1,
                "blocks.1": 1,
                "blocks.2": "cpu",
                "blocks.3": "cpu",
                "norm": "cpu",
                "head": 0,
                "scale": "cpu",
            },
        ),
        ({"cpu": 1000}, NO_SPLIT, {"": "disk"}),
    ],
)
def test_infer_auto_device_map_split_points(
    max_memory: dict[object, int], no_split: list[str] | None, expected: dict[str, object]
) -> None:
    device_map = infer_auto_device_map(
        empty_lm(), max_memory=max_memory, no_split_module_classes=no_split
    )
    assert device_map == expected
    assert list(device_map) == list(expected)


def test_balanced_strategies_spread_over_gpus() -> None:
    model = empty_lm()
    balanced = get_balanced_memory(model, {0: 100_000, 1: 100_000}, NO_SPLIT)
    assert balanced == {0: (TOTAL + 1) // 2 + BLOCK, 1: 100_000}
    assert infer_auto_device_map(model, balanced, NO_SPLIT) == {
        "embed": 0,
        "blocks.0": 0,
        "blocks.1": 1,
        "blocks.2": 1,
        "blocks.3": 1,
        "norm": 1,
        "head": 0,
        "scale": 1,
    }
    low_zero = get_balanced_memory(
        model, {0: 100_000, 1: 100_000, 2: 100_000}, NO_SPLIT, low_zero=True
    )
    assert low_zero[0] == 0
    plan = infer_auto_device_map(model, low_zero, NO_SPLIT)
    assert 0 not in plan.values() and plan["head"] == plan["embed"] == 1


def test_device_map_errors_name_the_problem(tmp_path: Path) -> None:
    model = empty_lm()
    with pytest.raises(
        DeviceMapError, match=r"does not place 12 tensor\(s\).*'blocks.2.ln.weight'"
    ):
        dispatch_model(model, {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "cpu", "norm": "cpu"})
    with pytest.raises(DeviceMapError, match="unknown device 'gpu7'"):
        dispatch_model(model, {"": "gpu7"})
    with pytest.raises(DeviceMapError, match=r"'block.0'.*closest names.*'blocks.0'"):
        dispatch_model(model, {"": "cpu", "block.0": "cpu"})
    with pytest.raises(DeviceMapError, match="GPU 3 but 0 GPU"):
        dispatch_model(model, {"": 3})
    with pytest.raises(DeviceMapError, match="not a strategy"):
        load_checkpoint_and_dispatch(model, tmp_path, device_map="fastest")


def test_load_and_dispatch_to_cpu_and_disk_matches(
    tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    reference, ids, expected = trained
    save_model(reference, tmp_path / "ckpt", max_shard_size="10KB")
    assert len(list((tmp_path / "ckpt").glob("*.safetensors"))) > 2
    model = load_checkpoint_and_dispatch(
        empty_lm(),
        tmp_path / "ckpt",
        device_map="auto",
        max_memory={"cpu": 30_000},
        no_split_module_classes=NO_SPLIT,
        offload_folder=tmp_path / "offload",
    )
    assert model.hf_device_map["blocks.3"] == "disk" and model.hf_device_map["embed"] == "cpu"
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    assert index["blocks.3.fc1.weight"] == {"dtype": "float32", "shape": [64, 16]}
    assert (tmp_path / "offload" / "blocks.3.fc1.weight.dat").stat().st_size == 64 * 16 * 4
    assert model.blocks[3].fc1.weight.device.type == "meta"
    assert model.blocks[0].fc1.weight.device.type == "cpu"
    with torch.no_grad():
        output = model(ids)
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    assert model.blocks[3].fc1.weight.device.type == "meta"  # released after the forward
    with pytest.raises(DispatchedModelError, match="offloaded"):
        model.to("cpu")
    with pytest.raises(DispatchedModelError, match="remove_hook_from_submodules"):
        model.cpu()
    remove_hook_from_submodules(model)
    assert model.blocks[3].fc1.weight.device.type == "cpu"
    torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)


def test_single_file_explicit_map_and_dtype(
    tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    reference, ids, expected = trained
    state = {k: v for k, v in reference.state_dict().items() if k != "head.weight"}
    save_file(state, tmp_path / "model.safetensors")
    device_map = {"embed": "cpu", "blocks": "disk", "norm": "cpu", "head": "cpu"}
    model = load_checkpoint_and_dispatch(
        empty_lm(), tmp_path / "model.safetensors", device_map, offload_folder=tmp_path / "off"
    )
    assert model.head.weight is model.embed.weight
    torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
    half = load_checkpoint_and_dispatch(
        empty_lm(), tmp_path / "model.safetensors", {"": "cpu"}, dtype=torch.bfloat16
    )
    assert half.blocks[0].fc1.weight.dtype == torch.bfloat16
    assert half.embed.weight.data_ptr() == half.head.weight.data_ptr()


def test_key_mismatch_and_missing_offload_folder_are_clear(
    tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    reference = trained[0]
    renamed = {k.replace("blocks.2.", "layers.2."): v for k, v in reference.state_dict().items()}
    renamed.pop("head.weight")
    save_file(renamed, tmp_path / "model.safetensors")
    with pytest.raises(StateDictMismatchError, match=r"'blocks.2.fc1.bias'.*layers.2.fc1.bias"):
        load_checkpoint_and_dispatch(empty_lm(), tmp_path / "model.safetensors", {"": "cpu"})
    with pytest.raises(InsufficientMemoryError, match="offload_folder"):
        load_checkpoint_and_dispatch(
            empty_lm(), tmp_path / "model.safetensors", "sequential", max_memory={"cpu": 20_000}
        )


def test_cpu_and_disk_offload_match_and_detach(
    tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    reference, ids, expected = trained
    for offload in (lambda m: cpu_offload(m, "cpu"), lambda m: disk_offload(m, tmp_path, "cpu")):
        model = TinyLM().eval()
        model.load_state_dict(reference.state_dict())
        offload(model)
        assert model.blocks[1].fc2.weight.device.type == "meta"
        with torch.no_grad():
            torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
        remove_hook_from_submodules(model)
        assert not hasattr(model, "_hf_hook") and "forward" not in model.blocks[0].__dict__
        torch.testing.assert_close(model.blocks[1].fc2.weight, reference.blocks[1].fc2.weight)
    assert (tmp_path / "index.json").exists()


@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_cpu_and_disk_offload_treat_meta_tensors_alike(
    kind: str, tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    """A tensor on ``meta`` (the first parameter here) is read from the offloaded weights.

    Both set-ups run the forward where the model's data is (the CPU), never on ``meta``; with no
    data for the tensor, both refuse before writing anything.
    """
    reference, ids, expected = trained

    def partly_empty() -> TinyLM:
        model = TinyLM().eval()
        model.load_state_dict(reference.state_dict())
        set_module_tensor_to_device(model, "embed.weight", "meta")
        return model

    def offload(model: TinyLM, folder: Path, with_data: bool, buffers: bool = False) -> None:
        if kind == "cpu":
            given = reference.state_dict() if with_data else None
            cpu_offload(model, state_dict=given, offload_buffers=buffers)
        else:
            if with_data:
                offload_state_dict(folder, reference.state_dict())
            disk_offload(model, folder, offload_buffers=buffers)

    model = partly_empty()
    offload(model, tmp_path / "filled", with_data=True)
    assert model.embed._hf_hook.execution_device == torch.device("cpu")
    with torch.no_grad():
        output = model(ids)
    assert output.device.type == "cpu"
    torch.testing.assert_close(output, expected, rtol=0, atol=0)

    with pytest.raises(StateDictMismatchError, match=r"meta device.*\['embed.weight'\]") as error:
        offload(partly_empty(), tmp_path / "empty", with_data=False)
    assert error.value.missing_keys == ["embed.weight"]
    assert not (tmp_path / "empty").exists()  # refused before writing any weight
    no_buffer = TinyLM().eval()
    set_module_tensor_to_device(no_buffer, "scale", "meta")
    with pytest.raises(StateDictMismatchError, match=r"offload_buffers=True.*\['scale'\]"):
        offload(no_buffer, tmp_path / "buffer", with_data=False)
    assert not hasattr(no_buffer, "_hf_hook")


def test_hooks_and_tensor_moves() -> None:
    calls: list[str] = []

    class Double(ModelHook):
        def pre_forward(self, module: nn.Module, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
            calls.append("pre")
            return tuple(2 * a for a in args), kwargs  # type: ignore[operator]

        def post_forward(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
            calls.append("post")
            return output + 1

    layer = nn.Linear(2, 2, bias=False)
    nn.init.eye_(layer.weight)
    add_hook_to_module(layer, Double())
    assert torch.equal(layer(torch.ones(2)), torch.full((2,), 3.0)) and calls == ["pre", "post"]
    remove_hook_from_module(layer)
    assert torch.equal(layer(torch.ones(2)), torch.ones(2))
    block = Block(4)
    set_module_tensor_to_device(block, "fc1.weight", "meta")
    assert block.fc1.weight.device.type == "meta" and isinstance(block.fc1.weight, nn.Parameter)
    set_module_tensor_to_device(block, "fc1.weight", "cpu", value=torch.zeros(16, 4))
    assert torch.equal(block.fc1.weight, torch.zeros(16, 4)) and block.fc1.weight.requires_grad


def test_bigger_than_budget_model_runs_within_budget(tmp_path: Path) -> None:
    """A 134 MB model (8 Blocks of 16.8 MB) with a 40 MB CPU budget: planned mostly to disk, loaded, run, RSS bounded."""
    width, depth, budget = 1024, 8, 40_000_000
    overhead = 48 * 1024 * 1024  # allocator slack, activations, Python objects
    torch.manual_seed(0)
    model = Stack(width, depth, 2 * width).eval()
    size = compute_module_sizes(model)[""]
    assert size > 3 * budget
    save_model(model, tmp_path / "ckpt", max_shard_size="40MB")
    sample = torch.randn(4, width)
    with torch.no_grad():
        torch.save({"input": sample, "output": model(sample)}, tmp_path / "reference.pt")
    del model
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("big_model_rss_child.py")),
            str(tmp_path / "ckpt"),
            str(tmp_path / "reference.pt"),
            str(tmp_path / "offload"),
            str(width),
            str(depth),
            str(budget),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["huge_bytes"] > 4 * 2**30
    assert report["empty_growth"] < 16 * 1024 * 1024, report
    assert report["max_abs_diff"] == 0.0, report
    assert list(report["device_map"].values()).count("disk") >= depth - 2, report
    assert report["peak_growth"] < budget + overhead, report


@pytest.mark.cuda
def test_gpu_cpu_disk_plan_runs_and_matches(
    tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    reference, ids, expected = trained
    save_model(reference, tmp_path / "ckpt", max_shard_size="10KB")
    # GPU 0 keeps room for a Block: embed+head and blocks.0 there, blocks.1 on cpu, rest on disk.
    max_memory = {0: 30_000, "cpu": 18_000}
    model = load_checkpoint_and_dispatch(
        empty_lm(),
        tmp_path / "ckpt",
        device_map="sequential",
        max_memory=max_memory,
        no_split_module_classes=NO_SPLIT,
        offload_folder=tmp_path / "offload",
    )
    assert set(model.hf_device_map.values()) == {0, "cpu", "disk"}, model.hf_device_map
    assert model.hf_device_map["embed"] == model.hf_device_map["head"] == 0
    assert model.embed.weight.device.type == "cuda"
    cpu_block = next(k for k, v in model.hf_device_map.items() if v == "cpu")
    assert model.get_submodule(cpu_block).fc1.weight.device.type == "meta"
    with torch.no_grad():
        output = model(ids)  # CPU input: output comes back on the CPU
    assert output.device.type == "cpu"
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        on_gpu = model(ids.cuda())
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(DispatchedModelError):
        model.cuda()


@pytest.mark.cuda
def test_cpu_offload_executes_on_gpu(trained: tuple[TinyLM, torch.Tensor, torch.Tensor]) -> None:
    reference, ids, expected = trained
    model = TinyLM().eval()
    model.load_state_dict(reference.state_dict())
    cpu_offload(model, execution_device=0)
    with torch.no_grad():
        output = model(ids)
    assert output.device.type == "cpu"
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["cpu", "disk"])
def test_offloading_buffers_keeps_non_persistent_ones_on_the_execution_device(
    kind: str, tmp_path: Path, trained: tuple[TinyLM, torch.Tensor, torch.Tensor]
) -> None:
    """``offload_buffers=True`` offloads the buffers a state dict holds, not the others.

    TinyLM's ``scale`` is non-persistent: no weights file holds it, so (as in Accelerate) it stays
    on the execution device while persistent tensors are brought in for each forward.
    """
    reference, ids, expected = trained
    model = TinyLM().eval()
    model.load_state_dict(reference.state_dict())
    with torch.no_grad():
        model.scale.mul_(2.0)  # a value no state dict could restore
        doubled = model(ids)
    assert not torch.equal(doubled, expected)
    if kind == "cpu":
        cpu_offload(model, execution_device="cpu", offload_buffers=True)
    else:
        disk_offload(model, tmp_path / "offload", execution_device="cpu", offload_buffers=True)
    assert model.scale.device.type == "cpu"
    assert model.embed.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(model(ids), doubled)
        assert torch.equal(model(ids), doubled)  # the second forward finds the same weights
