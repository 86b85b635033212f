"""bitsandbytes 8-bit and 4-bit loading on the CPU: accuracy, size, memory, offload, refusals.

The error bounds: LLM.int8() stores each output row as int8 with its own absmax scale (a step of
1/127 of the row's largest weight), so an output carries a relative error of a few 0.1%: we
require the relative Frobenius error of the logits below 1%. 4-bit stores 16 levels per block
of 64 weights (a step of about 1/8 of the block's absmax): a few percent, so below 10%. Both
are an order of magnitude under what an unquantized-vs-random comparison gives (~100%).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from big_model_helpers import Stack, TinyLM

from accel_ckpt import init_empty_weights, save_model
from accel_ckpt.big_modeling import (
    BnbQuantizationConfig,
    CustomDtype,
    compute_module_sizes,
    has_4bit_bnb_layers,
    load_and_quantize_model,
)
from accel_ckpt.errors import DeviceMapError, InvalidArgumentError

bnb = pytest.importorskip("bitsandbytes", reason="needs bitsandbytes (accel-ckpt[test])")

VOCAB, WIDTH, DEPTH = 128, 256, 4
EIGHT = {"load_in_8bit": True}
FOUR = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "fp32"}
FOUR_FP4 = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "fp4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "fp32",
}


def make() -> TinyLM:
    return TinyLM(vocab=VOCAB, width=WIDTH, depth=DEPTH)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("quantized")
    torch.manual_seed(0)
    model = make()
    save_model(model, folder / "ckpt", max_shard_size="300KB")
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(ids)
    linear_fp32 = (
        sum(m.weight.numel() * 4 for m in model.modules() if type(m) is torch.nn.Linear)
        - model.head.weight.numel() * 4
    )
    return {
        "folder": folder,
        "checkpoint": folder / "ckpt",
        "ids": ids,
        "reference": reference,
        "fp32_bytes": sum(p.numel() * 4 for p in model.parameters()),
        "linear_fp32": linear_fp32,
    }


def load(saved: dict, settings: dict, **kwargs) -> torch.nn.Module:
    with init_empty_weights():
        model = make()
    return load_and_quantize_model(
        model, BnbQuantizationConfig(**settings), saved["checkpoint"], **kwargs
    )


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def quantized_weight_bytes(model: torch.nn.Module) -> int:
    return sum(
        m.weight.numel() * m.weight.element_size()
        for m in model.modules()
        if isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))
    )


def test_shards_were_written(saved):
    assert len(list(Path(saved["checkpoint"]).glob("*.safetensors"))) > 3


@pytest.mark.parametrize(
    ("settings", "bound", "ratio", "layer"),
    [
        (EIGHT, 0.01, 4, "Linear8bitLt"),
        (FOUR, 0.10, 8, "Linear4bit"),
        (FOUR_FP4, 0.15, 8, "Linear4bit"),
    ],
    ids=["8bit", "4bit-nf4", "4bit-fp4-double"],
)
def test_quantized_outputs_sizes_and_layers(saved, settings, bound, ratio, layer):
    model = load(saved, settings)
    with torch.no_grad():
        got = model(saved["ids"])
    error = relative_error(got, saved["reference"])
    assert 0 < error < bound, error
    assert type(model.blocks[0].fc1).__name__ == layer
    # The head (last child, tied to the embedding) stays unquantized, as in Accelerate.
    assert type(model.head) is torch.nn.Linear and model.head.weight is model.embed.weight
    # Quantized weights take exactly 1/4 (int8) or 1/8 (packed 4-bit) of their fp32 bytes.
    assert quantized_weight_bytes(model) * ratio == saved["linear_fp32"]
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert total < saved["fp32_bytes"] / ratio * 1.25
    assert has_4bit_bnb_layers(model) == (ratio == 8)
    assert model.is_loaded_in_8bit == (ratio == 4) and model.hf_device_map == {"": "cpu"}


@pytest.mark.parametrize("settings", [EIGHT, FOUR], ids=["8bit", "4bit"])
def test_a_memory_budget_offloads_to_cpu_and_disk_with_the_same_outputs(saved, settings, tmp_path):
    in_memory = load(saved, settings)
    with torch.no_grad():
        want = in_memory(saved["ids"])
    config = BnbQuantizationConfig(**settings)
    with init_empty_weights():
        sizing = make()
    sizes = compute_module_sizes(
        sizing,
        special_dtypes={
            f"blocks.{i}.{fc}.weight": config.target_dtype
            for i in range(DEPTH)
            for fc in ("fc1", "fc2")
        },
    )
    budget = sizes[""] // 2
    model = load(
        saved,
        settings,
        device_map="auto",
        max_memory={"cpu": budget},
        offload_folder=tmp_path / "offload",
        no_split_module_classes=["Block"],
    )
    placed = set(model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, model.hf_device_map
    files = list((tmp_path / "offload").glob("*.quantized.safetensors"))
    assert files
    with torch.no_grad():
        got = model(saved["ids"])
        again = model(saved["ids"])
    assert torch.equal(got, want) and torch.equal(again, want)
    # Offloaded blocks hold no weights between forwards.
    offloaded = [
        k for k, v in model.hf_device_map.items() if v == "disk" and k.startswith("blocks")
    ]
    assert model.get_submodule(offloaded[0]).fc1.weight.device.type == "meta"


def test_4bit_sizes_count_half_a_byte_per_weight():
    with init_empty_weights():
        model = torch.nn.Linear(64, 32, bias=False)
    assert compute_module_sizes(model, dtype=CustomDtype.INT4)[""] == 64 * 32 // 2
    assert compute_module_sizes(model, dtype=torch.int8)[""] == 64 * 32


def test_loading_peak_memory_stays_below_the_fp32_model(tmp_path):
    width, depth = 1024, 6  # 6 blocks of two 1024x2048 layers: 100 MB of fp32 weights
    torch.manual_seed(0)
    save_model(Stack(width, depth, 2 * width), tmp_path / "big", max_shard_size="10MB")
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("quantized_rss_child.py")),
            str(tmp_path / "big"),
            str(width),
            str(depth),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        check=False,
        cwd=Path(__file__).parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["quantized_bytes"] < report["fp32_bytes"] * 0.3, report
    # The int8 model (~1/4) plus one fp32 tensor being quantized and its temporaries, not the
    # fp32 model (75 MB of 100 MB measured here, 60 MB with glibc's mmap threshold pinned).
    assert report["peak_growth"] < report["fp32_bytes"], report


def test_bad_configs_are_refused_with_the_field():
    with pytest.raises(InvalidArgumentError, match="exactly one of load_in_8bit"):
        BnbQuantizationConfig()
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)
    with pytest.raises(InvalidArgumentError, match="bnb_4bit_quant_type='int3'"):
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="int3")
    with pytest.raises(InvalidArgumentError, match="bnb_4bit_compute_dtype='fp64'"):
        BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="fp64")
    config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert config.bnb_4bit_compute_dtype is torch.bfloat16
    assert config.target_dtype is CustomDtype.INT4


def test_disk_plan_without_offload_folder_and_empty_model_without_weights_are_refused(saved):
    with init_empty_weights():
        model = make()
    with pytest.raises(InvalidArgumentError, match="weights_location"):
        load_and_quantize_model(model, BnbQuantizationConfig(load_in_8bit=True))
    with pytest.raises(InvalidArgumentError, match="offload_folder"):
        load(saved, EIGHT, device_map={"": "disk"})


def test_a_loaded_model_is_quantized_in_place(saved):
    torch.manual_seed(0)
    model = make()
    model = load_and_quantize_model(model, BnbQuantizationConfig(load_in_8bit=True))
    with torch.no_grad():
        got = model(saved["ids"])
    assert type(model.blocks[1].fc2).__name__ == "Linear8bitLt"
    assert relative_error(got, saved["reference"]) < 0.01


def test_missing_bitsandbytes_names_the_extra(monkeypatch, saved):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with init_empty_weights():
        model = make()
    with pytest.raises(InvalidArgumentError, match=r"accel-ckpt\[bnb\]"):
        load_and_quantize_model(
            model, BnbQuantizationConfig(load_in_8bit=True), saved["checkpoint"]
        )


@pytest.mark.cuda
def test_8bit_on_a_gpu_matches_the_cpu_result(saved):
    on_cpu = load(saved, EIGHT)
    on_gpu = load(saved, EIGHT, device_map={"": 0})
    with torch.no_grad():
        want = on_cpu(saved["ids"])
        got = on_gpu(saved["ids"].cuda()).cpu()
    assert on_gpu.blocks[0].fc1.weight.device.type == "cuda"
    assert relative_error(got, saved["reference"]) < 0.01
    assert relative_error(got, want) < 0.01


# ------------------------------------------------------------- Accelerate's helpers of utils.bnb
def test_replace_with_bnb_layers_keeps_the_weights_and_the_skipped_modules():
    from accel_ckpt.big_modeling.quantization import replace_with_bnb_layers

    torch.manual_seed(0)
    model = TinyLM(vocab=32, width=16, depth=2)
    model.head.weight = torch.nn.Parameter(torch.randn(32, 16))  # untie: a plain Linear head
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = BnbQuantizationConfig(**EIGHT)
    assert replace_with_bnb_layers(model, config, modules_to_not_convert=["head"]) is model
    layers = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear8bitLt)}
    assert layers and "head" not in layers and type(model.head) is torch.nn.Linear
    for name, layer in layers.items():
        assert torch.equal(layer.weight.data, before[f"{name}.weight"])  # not quantized yet
        assert not layer.weight.requires_grad
    # Inside a larger model, current_key_name places the names: "outer.blocks.0" is skipped.
    inner = TinyLM(vocab=32, width=16, depth=2)
    replace_with_bnb_layers(
        inner, BnbQuantizationConfig(**FOUR), ["outer.blocks.0"], current_key_name=["outer"]
    )
    kinds = {name: type(m).__name__ for name, m in inner.blocks.named_modules() if "." in name}
    assert {k: v for k, v in kinds.items() if k.startswith("0.")} and all(
        v != "Linear4bit" for k, v in kinds.items() if k.startswith("0.")
    )
    assert any(v == "Linear4bit" for k, v in kinds.items() if k.startswith("1."))


def test_get_parameter_device():
    from accel_ckpt.big_modeling.quantization import get_parameter_device

    assert get_parameter_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    with init_empty_weights():
        assert get_parameter_device(torch.nn.Linear(2, 2)).type == "meta"
    with pytest.raises(ValueError, match="ReLU has no parameters"):
        get_parameter_device(torch.nn.ReLU())


def test_get_quantized_model_device_map_counts_quantized_sizes():
    from accel_ckpt.big_modeling.quantization import get_quantized_model_device_map

    with init_empty_weights():
        model = Stack(width=64, depth=4)
    per_block_fp32 = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    budget = {"cpu": per_block_fp32 * 3}
    # The default skip list keeps the last child, here "blocks": nothing is quantized.
    fp32_plan = get_quantized_model_device_map(
        model, BnbQuantizationConfig(**EIGHT), "sequential", budget, ["Block"]
    )
    int8_plan = get_quantized_model_device_map(
        model, BnbQuantizationConfig(load_in_8bit=True, skip_modules=[]), "sequential", budget,
        ["Block"],
    )  # fmt: skip
    assert list(fp32_plan.values()).count("cpu") == 2
    assert "disk" in fp32_plan.values()
    assert set(int8_plan.values()) == {"cpu"}  # int8 weights: all four blocks fit
    assert get_quantized_model_device_map(model, BnbQuantizationConfig(**EIGHT), {"": "cpu"}) == {
        "": "cpu"
    }
    with pytest.raises(InvalidArgumentError, match="device_map='fastest'") as error:
        get_quantized_model_device_map(model, BnbQuantizationConfig(**EIGHT), "fastest")
    assert type(error.value) is DeviceMapError  # the planner load_checkpoint_and_dispatch uses
