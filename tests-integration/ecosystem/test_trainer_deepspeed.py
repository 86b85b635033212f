"""transformers' ``Trainer`` under DeepSpeed ZeRO-2 and ZeRO-3 on accel, against the DDP run.

Each job is ``trainer_job.py`` launched with ``accel launch --as_accelerate --cpu
--num_processes 2`` (gloo, DeepSpeed's CPU accelerator): it trains two epochs (evaluating and
checkpointing after each), resumes a second Trainer from the first epoch's checkpoint, and saves
the model with ``save_model``. Four launches, each run once per session by the shared job
runner (ecosystem_jobs.py): DDP (the reference: the run test_trainer.py compares with
Accelerate), ``TrainingArguments(deepspeed=<ZeRO-2 file>)``, ``deepspeed=<ZeRO-3 file>`` and the launcher's
DeepSpeed (``--use_deepspeed --zero_stage 2``: transformers builds ``DeepSpeedPlugin()`` itself).
ZeRO only partitions fp32 state, so every logged value matches DDP within 1e-5.

The first DeepSpeed launch on a machine JIT-builds DeepSpeed's shared-memory comm op (minutes);
``TORCH_EXTENSIONS_DIR`` keeps it for later runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ecosystem_jobs import JobRunner, assert_same_history, require_libraries

require_libraries()
pytest.importorskip("deepspeed", reason="deepspeed is not installed (run `nox -s ecosystem`)")

TRAINER = "trainer_job.py"
#: A generous hard limit: the first DeepSpeed job may compile DeepSpeed's C++ op.
DEEPSPEED_JOB_TIMEOUT = 1200
TOLERANCE = 1e-5
#: ZeRO-3 partitions the parameters, so the Trainer's parameter count for its flos estimate
#: (and so ``total_flos``) sees only this process's partition; not a training value.
NOT_COMPARED = ("total_flos",)

_AUTO_BATCH = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "zero2": {**_AUTO_BATCH, "zero_optimization": {"stage": 2}},
    "zero3": {
        **_AUTO_BATCH,
        "zero_optimization": {
            "stage": 3,
            "stage3_gather_16bit_weights_on_model_save": True,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    },
}
#: job name -> (extra launcher flags, extra trainer_job.py arguments)
JOBS: dict[str, tuple[list[str], list[str]]] = {
    "ddp": ([], []),
    "zero2": ([], ["--deepspeed", "{config}"]),
    "zero3": ([], ["--deepspeed", "{config}"]),
    "launcher_zero2": (["--use_deepspeed", "--zero_stage", "2"], []),
}
STAGES = {"zero2": 2, "zero3": 3, "launcher_zero2": 2}


def run(jobs: JobRunner, name: str) -> dict[str, Any]:
    """The ``--resume`` job ``name`` (``ddp`` is the run test_trainer.py compares with Accelerate)."""
    flags, job_args = JOBS[name]
    config = jobs.root / f"deepspeed-{name}.json"
    if name in CONFIGS and not config.exists():
        config.write_text(json.dumps(CONFIGS[name]))
    args = [arg.format(config=config) for arg in job_args]
    return jobs.run(
        "accel", TRAINER, "--resume", *args, flags=tuple(flags), timeout=DEEPSPEED_JOB_TIMEOUT
    )


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no safetensors weights in {folder}"
    weights: dict[str, Any] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


@pytest.mark.timeout(4 * DEEPSPEED_JOB_TIMEOUT)
@pytest.mark.parametrize("name", ["zero2", "zero3", "launcher_zero2"])
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
    assert_same_history(result["history"], ddp["history"], TOLERANCE, ignore=NOT_COMPARED)
    # The second Trainer resumed from checkpoint-4 (DeepSpeed's engine checkpoint) and logged
    # the second epoch as the uninterrupted run did.
    assert_same_history(
        result["resumed_history"], ddp["resumed_history"], TOLERANCE, ignore=NOT_COMPARED
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
