"""Settings resolved once into a frozen RunConfig and handed down (issue: worker side rebuilt)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accel import Accelerator, DistributedDataParallelKwargs, GradientAccumulationPlugin
from accel.amp import get_mixed_precision_context_manager
from accel.errors import AcceleratorConfigError
from accel.fp8 import AORecipeKwargs
from accel.precision import AUTOCAST_DTYPES, autocast_dtype, make_precision
from accel.run_config import RunConfig
from accel.strategies.fsdp.precision import mixed_precision_dtypes
from accel_state import PrecisionType, reset_state

ROOT = Path(__file__).resolve().parents[3]


def test_the_accelerator_resolves_one_frozen_configuration_and_hands_it_down() -> None:
    handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(
        mixed_precision="bf16", cpu=True, gradient_accumulation_steps=3, kwargs_handlers=[handler]
    )
    config = accelerator.run_config
    assert isinstance(config, RunConfig)
    assert config.mixed_precision is PrecisionType.BF16
    assert config.gradient_accumulation_steps == 3
    assert config.gradient_state is accelerator.gradient_state
    assert config.process is accelerator.state.partial
    assert dict(config.ddp_settings) == {"find_unused_parameters": True}
    assert accelerator.strategy.config is config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mixed_precision = PrecisionType.NO  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.ddp_settings["static_graph"] = True  # type: ignore[index]


def test_one_rule_for_unset_arguments_the_signature_default_defers(monkeypatch: Any) -> None:
    """Left at its default, an argument takes the launcher's or dataloader_config's value."""
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "bf16")
    reset_state()
    deferred = Accelerator(cpu=True, gradient_accumulation_steps=1)
    assert deferred.run_config.gradient_accumulation_steps == 4
    assert deferred.run_config.mixed_precision is PrecisionType.BF16
    assert deferred.dataloader_config.split_batches is False
    reset_state()
    chosen = Accelerator(
        cpu=True, gradient_accumulation_steps=2, mixed_precision="no", split_batches=True
    )
    assert chosen.run_config.gradient_accumulation_steps == 2
    assert chosen.run_config.mixed_precision is PrecisionType.NO
    assert chosen.run_config.split_batches is True
    reset_state()
    with pytest.raises(AcceleratorConfigError, match="gradient_accumulation_steps=2 and"):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3),
        )


@pytest.mark.parametrize("mode", ["no", "fp16", "bf16"])
def test_every_layer_reads_the_one_mode_to_dtype_map(mode: str) -> None:
    """Precision objects, FSDP's policy and Accelerate's free autocast helper agree per mode."""
    expected = AUTOCAST_DTYPES[PrecisionType(mode)]
    assert make_precision(mode, torch.device("cpu")).autocast_dtype == expected
    assert mixed_precision_dtypes(None, mode)["param_dtype"] == expected
    Accelerator(mixed_precision=mode, cpu=True)
    with get_mixed_precision_context_manager(native_amp=True):
        computed = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype
    # Without a mixed-precision mode torch's own CPU autocast dtype (bf16) applies, as in Accelerate.
    assert computed == (expected or torch.get_autocast_dtype("cpu"))


def test_fp8_computes_the_rest_in_bf16() -> None:
    assert autocast_dtype("fp8") is torch.bfloat16
    assert mixed_precision_dtypes(None, "fp8")["param_dtype"] is torch.bfloat16


def test_the_fp8_setup_is_resolved_once_and_the_strategy_builds_its_precision() -> None:
    """fp8's backend and recipe sit in the RunConfig; the strategy, not the Accelerator, builds it."""
    pytest.importorskip("torchao", reason="the fp8 precision object here is torchao's")
    recipe = AORecipeKwargs()
    accelerator = Accelerator(mixed_precision="fp8", cpu=True, kwargs_handlers=[recipe])
    fp8 = accelerator.run_config.fp8
    assert fp8 is not None and fp8.enabled and fp8.given is recipe
    assert accelerator.fp8_enabled and accelerator.has_fp8_handler
    rebuilt = accelerator.strategy.make_precision()
    assert type(rebuilt) is type(accelerator.precision)
    assert rebuilt.autocast_dtype is torch.bfloat16
    reset_state()
    plain = Accelerator(mixed_precision="bf16", cpu=True)
    assert plain.run_config.fp8 is not None and not plain.run_config.fp8.enabled


def test_the_lint_rule_finds_process_wide_state_reads(tmp_path: Path, repo_script: Any) -> None:
    source = tmp_path / "layer.py"
    source.write_text(
        "from accel.accelerator_state import AcceleratorState\n"
        "def mode():\n"
        "    return AcceleratorState().mixed_precision\n"
        "def count(state):\n"
        "    return state._shared_state['x']\n"
        "def ok(config):\n"
        "    return config.mixed_precision\n"
    )
    found = repo_script("state_reads").state_reads(source)
    assert found == [(3, "AcceleratorState()"), (5, "._shared_state")]


def test_no_layer_of_accel_reads_the_process_wide_state() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "state_reads.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout
    assert "outside the state modules: 0" in result.stdout


def test_the_lint_rule_finds_imports_between_backend_folders(repo_script: Any) -> None:
    graph = {
        "accel.strategies.ddp.strategy": {"accel.strategies.base"},
        "accel.strategies.fsdp.strategy": {"accel.strategies.ddp.buckets"},
        "accel.strategies.mesh.strategy": {"accel.strategies.fsdp.strategy"},
        "accel.strategies.deepspeed.plugin": {"accel.strategies.deepspeed.config"},
    }
    crossings = repo_script("import_cycles").backend_crossings(graph)
    # mesh -> fsdp is the one allowed edge (listed with its reason); inside a folder is fine.
    assert crossings == [("accel.strategies.fsdp.strategy", "accel.strategies.ddp.buckets")]
