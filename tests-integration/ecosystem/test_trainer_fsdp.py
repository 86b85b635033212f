"""transformers' ``Trainer`` under FSDP2 and FSDP1 on accel, on 2 CPU processes (gloo).

Accelerate cannot run FSDP on a CPU, so the reference is the same job under DDP on accel (the
one ``test_trainer.py`` checks against Accelerate): FSDP shards the same computation, and every
logged value agrees within 1e-5. Each job trains two epochs with an evaluation and a sharded
checkpoint per epoch, resumes from the first checkpoint, loads the best model at the end, and
saves the final model after switching to ``FULL_STATE_DICT`` (transformers' recipe for
``SHARDED_STATE_DICT`` training); the saved weights reload with ``from_pretrained`` and equal
the gathered ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from ecosystem_jobs import JobRunner, assert_same_history, require_libraries
from trainer_jobs import FULL_RUN, TRAINER, fsdp1_from_training_arguments, fsdp_configs

require_libraries()

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def configs(jobs: JobRunner) -> dict[str, str]:
    """The FSDP config files the jobs read (see trainer_jobs.py)."""
    return fsdp_configs(jobs)


def _without_flos(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history without ``total_flos``.

    The Trainer counts flos from ``model.num_parameters()``; under FSDP1 the model's parameters
    are this process's shards between steps (torch's ``use_orig_params``), so it counts half.
    """
    return [{k: v for k, v in record.items() if k != "total_flos"} for record in history]


def _check_full_run(result: dict[str, Any], reference: dict[str, Any], version: int) -> None:
    assert result["is_fsdp_enabled"] is True
    assert result["distributed_type"] == "DistributedType.FSDP"
    assert result["fsdp_version"] == version
    assert result["num_processes"] == 2
    history, expected = result["history"], reference["history"]
    if version == 1:
        history, expected = _without_flos(history), _without_flos(expected)
    assert_same_history(history, expected, TOLERANCE)
    # The resumed run starts from the first epoch's checkpoint and logs the second epoch again.
    resumed, expected = result["resumed_history"], reference["resumed_history"]
    assert [r["step"] for r in resumed if "loss" in r] == [1, 2, 3, 4, 5, 6, 7, 8]
    if version == 1:
        resumed, expected = _without_flos(resumed), _without_flos(expected)
    assert_same_history(resumed, expected, TOLERANCE)
    assert result["reloaded_equal"] is True


@pytest.fixture(scope="module")
def ddp(jobs: JobRunner) -> dict[str, Any]:
    """The reference: the same job under DDP (shared with test_trainer.py's 2-process run)."""
    result = jobs.run("accel", TRAINER, "--resume")
    assert result["is_fsdp_enabled"] is False
    return result


def test_fsdp2_from_the_seed_launcher_config(
    jobs: JobRunner, configs: dict[str, str], ddp: dict[str, Any]
) -> None:
    """``accel launch --config_file`` (distributed_type: FSDP) with no FSDP in TrainingArguments.

    The launcher's settings make ``AcceleratorState().fsdp_plugin``, so the Trainer sees FSDP
    (checkpoints with ``save_fsdp_model``; no DTensors handed to safetensors).
    """
    flags = ("--config_file", configs["launch_fsdp2.yaml"])
    result = jobs.run("accel", TRAINER, *FULL_RUN, flags=flags)
    _check_full_run(result, ddp, version=2)
    assert result["model_class"] == "FSDPBertForSequenceClassification"
    assert result["saved_files"] == ["config.json", "model.safetensors", "training_args.bin"]


def test_fsdp1_from_training_arguments(
    jobs: JobRunner, configs: dict[str, str], ddp: dict[str, Any]
) -> None:
    """``TrainingArguments(fsdp="full_shard", fsdp_config={"version": 1, ...})``.

    transformers passes the FSDP1 sharding strategy as ``reshard_after_forward="full_shard"``
    and ``adapter_only=True`` to ``save_fsdp_model`` (ignored: not a PEFT model).
    """
    result = fsdp1_from_training_arguments(jobs)
    _check_full_run(result, ddp, version=1)
    assert result["model_class"] == "FullyShardedDataParallel"


def test_peft_lora_under_fsdp2_saves_adapters(jobs: JobRunner, configs: dict[str, str]) -> None:
    """PEFT LoRA under FSDP2 from TrainingArguments logs what it logs under DDP.

    Checkpoints and the final save hold the adapters (and the trained classifier), as
    Accelerate writes them, not the whole model.
    """
    reference = jobs.run("accel", TRAINER, "--resume", "--peft-lora")
    args = ("--fsdp", "full_shard", "--fsdp-config", configs["fsdp2.json"], "--peft-lora")
    result = jobs.run("accel", TRAINER, *args, *FULL_RUN)
    _check_full_run(result, reference, version=2)
    assert result["model_class"] == "FSDPPeftModelForSequenceClassification"
    assert "adapter_model.safetensors" in result["saved_files"]
    assert "model.safetensors" not in result["saved_files"]
    assert result["checkpoint_keys"], "no FSDP checkpoint keys recorded"
    keys = result["checkpoint_keys"]
    frozen = [key for key in keys if "lora_" not in key and "classifier" not in key]
    assert frozen == [], f"the checkpoint holds frozen base weights: {frozen[:3]}"
