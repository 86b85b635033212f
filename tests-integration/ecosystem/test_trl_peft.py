"""TRL's ``SFTTrainer``, with and without a PEFT LoRA adapter, on accel and on Accelerate."""

from __future__ import annotations

import pytest
from ecosystem_jobs import JobRunner, assert_same_history, require_libraries

require_libraries()

SFT = "sft_job.py"


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_trainer_matches_accelerate(jobs: JobRunner, lora: bool) -> None:
    """Losses, token accuracy and eval metrics agree; LoRA saves only the adapter."""
    args = ("--lora",) if lora else ()
    mine = jobs.run("accel", SFT, *args)
    theirs = jobs.run("accelerate", SFT, *args)
    assert mine["num_processes"] == 2
    assert_same_history(mine["history"], theirs["history"], 1e-6)
    assert mine["saved_files"] == theirs["saved_files"]
    if lora:
        assert "adapter_model.safetensors" in mine["saved_files"]
        assert "model.safetensors" not in mine["saved_files"]
