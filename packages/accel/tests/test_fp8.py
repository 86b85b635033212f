"""fp8 training through torchao on 2 gloo processes (DDP and FSDP2), and fp8 refusals.

torchao's ``Float8Linear`` runs its matmuls through ``torch._scaled_mm``, which has a CPU kernel
in torch 2.13, so everything here is real fp8 arithmetic on the CPU (slow per FLOP, hence the
small model).
"""

from __future__ import annotations

import math
import subprocess
import sys

import fp8_workers
import pytest
import torch
from torch_support import torchao_skip_reason

from accel import Accelerator
from accel.fp8 import AORecipeKwargs
from accel_ckpt import load_checkpoint_in_model
from accel_state.testing import spawn_workers

if (_SKIP_REASON := torchao_skip_reason()) is not None:  # the xla leg's torch 2.9, say
    pytest.skip(_SKIP_REASON, allow_module_level=True)

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(900)
STRATEGIES = ("ddp", "fsdp2")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("fp8"))


@pytest.fixture(scope="module")
def first(folder) -> list[dict]:
    return spawn_workers(fp8_workers.first_launch, 2, args=(folder,), timeout=800)


@pytest.fixture(scope="module")
def resumed(first, folder) -> list[dict]:
    """A fresh launch (new processes) that loads the checkpoint the first launch saved."""
    return spawn_workers(fp8_workers.resume_launch, 2, args=(folder,), timeout=800)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_right_layers_become_float8(first, strategy):
    for rank in first:
        kinds = rank[strategy]["kinds"]
        assert rank[strategy]["backend"] == "AO"
        assert sorted(n for n, k in kinds.items() if k == "Float8Linear") == (
            fp8_workers.EXPECTED_FP8
        )
        assert sorted(n for n, k in kinds.items() if k == "Linear") == fp8_workers.EXPECTED_KEPT


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fp8_losses_stay_within_5_percent_of_bf16_at_every_step(first, strategy):
    for rank in first:
        fp8, bf16 = rank[strategy]["fp8"], rank[strategy]["bf16"]
        assert len(fp8) == len(bf16) == fp8_workers.STEPS
        assert all(math.isfinite(loss) for loss in fp8)
        for step, (a, b) in enumerate(zip(fp8, bf16, strict=True)):
            assert abs(a - b) <= 0.05 * b, (step, a, b)
        # It learns (the sequence rule is learnable) and it is not the bf16 run again.
        assert fp8[-1] < 0.6 * fp8[0]
        assert fp8 != bf16
    # Every rank reports the same global losses.
    assert first[0][strategy]["fp8"] == first[1][strategy]["fp8"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resuming_in_a_fresh_launch_continues_with_equal_losses(first, resumed, strategy):
    for before, after in zip(first, resumed, strict=True):
        continued = before[strategy]["fp8"][fp8_workers.SAVE_AT :]
        assert after[strategy]["fp8"] == pytest.approx(continued, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradient_accumulation_trains_in_fp8(first, strategy):
    for rank in first:
        losses = rank[strategy]["fp8_accumulate"]
        assert len(losses) == 10 and all(math.isfinite(loss) for loss in losses)
        # Two micro-batches of the same global batch: the same start as the one-step run.
        assert losses[0] == pytest.approx(rank[strategy]["fp8"][0], rel=1e-2)
        assert losses[-1] < losses[0]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_saved_fp8_weights_are_plain_tensors_that_load_into_the_unconverted_model(
    first, folder, strategy
):
    model = fp8_workers.make_model()  # plain nn.Linear layers, fresh weights
    keys = load_checkpoint_in_model(model, f"{folder}/{strategy}/weights", strict=True)
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    expected = first[0][strategy]["saved_from"]
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, tensor in state.items():
        assert type(tensor) is torch.Tensor and tensor.dtype == torch.float32
        assert tensor.sum().item() == pytest.approx(expected[name], rel=1e-6, abs=1e-6), name


def test_fp8_recipe_without_fp8_precision_is_refused():
    from accel import AcceleratorConfigError

    with pytest.raises(AcceleratorConfigError, match="mixed_precision='fp8'"):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[AORecipeKwargs()])


def test_a_custom_filter_and_config_are_used():
    from torchao.float8 import Float8LinearConfig

    seen = []

    def only_mlp(module: torch.nn.Module, fqn: str) -> bool:
        seen.append(fqn)
        return ".mlp." in fqn

    recipe = AORecipeKwargs(config=Float8LinearConfig(emulate=True), module_filter_func=only_mlp)
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[recipe])
    assert accelerator.ao_recipe_handler is not None
    assert accelerator.ao_recipe_handler.module_filter_func is only_mlp
    model = accelerator.prepare(fp8_workers.make_model())
    kinds = fp8_workers.layer_kinds(model)
    assert sorted(n for n, k in kinds.items() if k == "Float8Linear") == [
        f"blocks.{i}.mlp.{j}" for i in (0, 1) for j in (0, 2)
    ]
    # The gates (8 outputs) never reach the filter: dimensions not divisible by 16.
    assert "blocks.0.gate" not in seen and "blocks.0.qkv" in seen
    assert model.blocks[0].mlp[0].config.emulate


def test_compiled_fp8_model_matches_eager():
    tokens = fp8_workers.global_batch(0)
    accelerator = Accelerator(mixed_precision="fp8", dynamo_backend="aot_eager")
    compiled = accelerator.prepare(fp8_workers.make_model())
    assert compiled is not accelerator.unwrap_model(compiled, keep_torch_compile=False)
    loss = fp8_workers.lm_loss(compiled, tokens)
    loss.backward()
    eager = accelerator.unwrap_model(compiled, keep_torch_compile=False)
    assert fp8_workers.layer_kinds(eager)["blocks.0.proj"] == "Float8Linear"
    reference = fp8_workers.lm_loss(eager, tokens)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert eager.blocks[0].proj.weight.grad is not None


@pytest.mark.cuda
def test_fp8_on_a_gpu_follows_bf16():
    """On a GPU: fp8 matmuls where the GPU has them (8.9+), else the refusal names the reason."""
    from accel import UnsupportedFeatureError
    from accel.fp8 import check_cuda_fp8_capability

    if not check_cuda_fp8_capability():
        with pytest.raises(UnsupportedFeatureError, match="compute capability"):
            Accelerator(mixed_precision="fp8")
        return
    losses = {}
    for precision in ("bf16", "fp8"):
        from accel_state import reset_state

        reset_state()
        run = fp8_workers.Run(Accelerator(mixed_precision=precision))
        losses[precision] = run.train(10)
    assert fp8_workers.layer_kinds(run.model)["blocks.0.proj"] == "Float8Linear"
    for a, b in zip(losses["fp8"], losses["bf16"], strict=True):
        assert abs(a - b) <= 0.05 * b


def test_import_accel_loads_no_optional_package():
    code = (
        "import sys, accel, accel.utils\n"
        "from accel import Accelerator\n"
        "from accel.utils import AORecipeKwargs, BnbQuantizationConfig, load_and_quantize_model\n"
        "import accel.utils.ao, accel.utils.bnb, accel.utils.transformer_engine, accel.fp8\n"
        "Accelerator()\n"
        "bad = [m for m in ('torchao', 'bitsandbytes', 'transformer_engine', 'msamp', 'deepspeed')"
        " if m in sys.modules]\n"
        "sys.exit(f'imported {bad}' if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
