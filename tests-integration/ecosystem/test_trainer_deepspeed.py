"""transformers' ``Trainer`` under DeepSpeed ZeRO-2 and ZeRO-3 on accel, against the DDP run.

Each job is ``trainer_job.py`` launched with ``accel launch --as_accelerate --cpu
--num_processes 2`` (gloo, DeepSpeed's CPU accelerator): it trains two epochs (evaluating and
checkpointing after each), resumes a second Trainer from the first epoch's checkpoint, and saves
the model with ``save_model``. Five launches (trainer_jobs.py), each run once per session by the
shared job runner (ecosystem_jobs.py): DDP (the reference: the run test_trainer.py compares with
Accelerate), ``TrainingArguments(deepspeed=<ZeRO-2 file>)``, the same file with an
``optimizer`` section (DeepSpeed builds torch's AdamW; the Trainer passes Accelerate a
``DummyOptim`` and a ``DummyScheduler``), ``deepspeed=<ZeRO-3 file>`` and the launcher's DeepSpeed
(``--use_deepspeed --zero_stage 2``: transformers builds ``DeepSpeedPlugin()`` itself). ZeRO only
partitions fp32 state, so every logged value matches DDP within 1e-5.

The first DeepSpeed launch on a machine JIT-builds DeepSpeed's shared-memory comm op (minutes);
``TORCH_EXTENSIONS_DIR`` keeps it for later runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ecosystem_jobs import JobRunner, assert_same_history, require_libraries
from trainer_jobs import CONFIGS, DEEPSPEED_JOB_TIMEOUT, NOT_COMPARED, STAGES, TOLERANCE
from trainer_jobs import deepspeed_job as run

require_libraries()
pytest.importorskip("deepspeed", reason="deepspeed is not installed (run `nox -s ecosystem`)")


def learning_rates(history: list[dict[str, Any]]) -> list[float]:
    return [entry["learning_rate"] for entry in history if "loss" in entry]


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors weights in {folder}"
    weights: dict[str, Any] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


@pytest.mark.timeout(4 * DEEPSPEED_JOB_TIMEOUT)
@pytest.mark.parametrize("name", ["zero2", "zero3", "launcher_zero2", "zero2_optimizer_in_config"])
def test_trainer_under_deepspeed_logs_what_ddp_logs(jobs: JobRunner, name: str) -> None:
    ddp, result = run(jobs, "ddp"), run(jobs, name)
    stage = STAGES[name]
    assert ddp["distributed_type"] == "DistributedType.MULTI_CPU"
    assert result["distributed_type"] == "DistributedType.DEEPSPEED"
    assert result["is_deepspeed_enabled"] and result["num_processes"] == 2
    assert "+accel." in result["accelerate_version"]  # `import accelerate` gave accel
    facts = result["deepspeed"]
    assert facts["engine_class"] == "DeepSpeedEngine"
    assert facts["engine_zero_stage"] == stage and facts["plugin_zero_stage"] == stage
    # transformers' weakref (from_pretrained, resize_token_embeddings) knows ZeRO-3 is on.
    assert facts["zero3_enabled"] == (stage == 3)
    # "auto" values filled from the TrainingArguments: batch 8, max_grad_norm 1.0.
    assert facts["engine_micro_batch"] == 8 and facts["engine_gradient_clipping"] == 1.0
    # Two epochs of 4 steps, evaluated after each: losses, norms, learning rates, eval losses.
    assert sum("eval_loss" in entry for entry in result["history"]) == 2
    ignored = NOT_COMPARED
    if "optimizer" in CONFIGS.get(name, {}):
        # DeepSpeed's engine owns the scheduler then and steps it inside backward, before the
        # Trainer reads the rate it logs: the log is one step ahead, the training the same.
        ignored = (*NOT_COMPARED, "learning_rate")
        logged, reference = learning_rates(result["history"]), learning_rates(ddp["history"])
        assert logged[:-1] == reference[1:] and logged[-1] == 0.0, (logged, reference)
    assert_same_history(result["history"], ddp["history"], TOLERANCE, ignore=ignored)
    # The second Trainer resumed from checkpoint-4 (DeepSpeed's engine checkpoint) and logged
    # the second epoch as the uninterrupted run did.
    assert_same_history(
        result["resumed_history"], ddp["resumed_history"], TOLERANCE, ignore=ignored
    )
    out = Path(result["_out"])
    assert (out / "trainer" / "checkpoint-4" / "global_step4").is_dir()
    assert (out / "trainer" / "checkpoint-8" / "global_step8").is_dir()


@pytest.mark.timeout(4 * DEEPSPEED_JOB_TIMEOUT)
@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_save_model_writes_the_full_trained_weights(jobs: JobRunner, name: str) -> None:
    """``save_model`` (ZeRO-3: the gathered 16-bit state dict) holds DDP's final weights."""
    import torch

    ddp, result = run(jobs, "ddp"), run(jobs, name)
    expected = _weights(Path(ddp["_out"]) / "final")
    saved = _weights(Path(result["_out"]) / "final")
    assert sorted(saved) == sorted(expected)
    for key, tensor in expected.items():
        assert saved[key].shape == tensor.shape and saved[key].dtype == torch.float32, key
        torch.testing.assert_close(saved[key], tensor, rtol=0, atol=TOLERANCE)
