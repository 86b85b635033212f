"""transformers' ``Trainer`` on accel logs exactly what it logs on Accelerate 1.15.0."""

from __future__ import annotations

import pytest
from ecosystem_jobs import JobRunner, assert_same_history, require_libraries

require_libraries()

TRAINER = "trainer_job.py"
EXACT = 1e-6


@pytest.mark.parametrize("processes", [1, 2])
def test_train_evaluate_checkpoint_resume_save(jobs: JobRunner, processes: int) -> None:
    """Train with per-epoch eval and checkpoints, resume from the first, save and reload."""
    mine = jobs.run("accel", TRAINER, "--resume", processes=processes)
    theirs = jobs.run("accelerate", TRAINER, "--resume", processes=processes)
    assert mine["num_processes"] == theirs["num_processes"] == processes
    assert mine["accelerate_version"].startswith("1.15.0+accel.")
    assert theirs["accelerate_version"] == "1.15.0"
    assert_same_history(mine["history"], theirs["history"], EXACT)
    assert mine["resumed_history"], "the resumed run logged nothing"
    assert_same_history(mine["resumed_history"], theirs["resumed_history"], EXACT)
    assert mine["reloaded_equal"] is True


def test_bf16_from_the_launcher_flag(jobs: JobRunner) -> None:
    """``accel launch --mixed_precision bf16`` reaches the Trainer (ACCELERATE_MIXED_PRECISION)."""
    flags = ("--mixed_precision", "bf16")
    mine = jobs.run("accel", TRAINER, flags=flags)
    theirs = jobs.run("accelerate", TRAINER, flags=flags)
    assert mine["mixed_precision"] == "bf16"
    assert mine["dtypes"] == theirs["dtypes"] == ["torch.bfloat16"]
    assert_same_history(mine["history"], theirs["history"], EXACT)


def test_bf16_accumulation_and_auto_batch_size_from_training_arguments(jobs: JobRunner) -> None:
    """``TrainingArguments(bf16=True, gradient_accumulation_steps=2, auto_find_batch_size=True)``."""
    args = ("--bf16", "--grad-accum", "2", "--auto-find-batch-size")
    mine = jobs.run("accel", TRAINER, *args)
    theirs = jobs.run("accelerate", TRAINER, *args)
    assert mine["mixed_precision"] == "bf16"
    assert mine["dtypes"] == theirs["dtypes"] == ["torch.bfloat16"]
    assert mine["train_batch_size"] == theirs["train_batch_size"] == 8
    # 64 samples, 8 per process and step, 2 processes, 2 micro-steps: 2 optimizer steps an epoch.
    steps = [record["step"] for record in mine["history"] if "loss" in record]
    assert steps == [1, 2, 3, 4]
    assert_same_history(mine["history"], theirs["history"], EXACT)
