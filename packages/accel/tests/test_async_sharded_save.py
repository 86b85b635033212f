"""save_state(blocking=False) under FSDP and DeepSpeed: staged in host memory, written in the
background."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import async_ckpt_workers
import pytest
import torch

from accel_ckpt import latest_checkpoint
from accel_state.testing import WorkerFailedError, spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("async_fsdp")
    return spawn_workers(async_ckpt_workers.round_trip_job, 2, args=(str(folder),), timeout=600)


@pytest.mark.parametrize("config", sorted(async_ckpt_workers.CONFIGS))
def test_async_save_round_trips_while_training_goes_on(round_trips, config):
    for rank in round_trips:
        result = rank[config]
        assert result["weights_equal"]
        # Training right after the call (collectives on the default group while the background
        # write ran its own on the checkpoint's gloo group) did not change what was saved.
        assert result["losses_after_load"] == pytest.approx(result["losses_after_save"], abs=1e-6)
    assert round_trips[0][config]["returned_before_commit"]


def test_sharded_async_save_writes_one_shard_file_per_rank(round_trips):
    files = round_trips[0]["fsdp2_sharded"]["files"]
    assert ".metadata" in files
    assert sum(name.endswith(".distcp") for name in files) == 2
    assert round_trips[0]["fsdp2_full"]["files"] == ["model.safetensors", "optimizer.pt"]


def test_kill_during_background_write_leaves_previous_checkpoint_newest(tmp_path):
    with pytest.raises(WorkerFailedError, match=r"code -9"):
        spawn_workers(
            async_ckpt_workers.save_then_die_job, 2, args=(str(tmp_path),), timeout=600, reuse=False
        )
    first = Path((tmp_path / "first.txt").read_text())
    checkpoints = tmp_path / "checkpoints"
    # The main thread trained on while the write was pending, on both ranks.
    for rank in (0, 1):
        assert len(json.loads((tmp_path / f"trained_rank{rank}.json").read_text())) == 2
        held = json.loads((tmp_path / f"held_rank{rank}").read_text())
        assert any(name.endswith(".distcp") for name in held)  # shards were on disk at the kill
    hidden = [p for p in checkpoints.iterdir() if p.name.startswith(".checkpoint_1.accel-tmp-")]
    assert hidden, "the killed save left its temporary folder (and nothing public)"
    assert not (checkpoints / "checkpoint_1").exists()
    assert latest_checkpoint(checkpoints) == first
    resumed = spawn_workers(async_ckpt_workers.resume_job, 2, args=(str(tmp_path),), timeout=600)
    for rank in resumed:
        assert rank["latest"] == str(first)
        assert rank["weights_equal"]


def test_async_save_on_a_two_dimensional_mesh_round_trips(tmp_path):
    ranks = spawn_workers(
        async_ckpt_workers.nd_round_trip_job, 4, args=(str(tmp_path),), timeout=600
    )
    for rank in ranks:
        assert rank["weights_equal"]
        assert rank["losses_after_load"] == pytest.approx(rank["losses_after_save"], abs=1e-6)


# ---------------------------------------------------------------------- DeepSpeed ZeRO-1/2/3
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)


def _same(first: dict, second: dict) -> bool:
    return sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)


@needs_deepspeed
def test_deepspeed_async_save_round_trips_while_training_goes_on(tmp_path):
    ranks = spawn_workers(
        async_ckpt_workers.deepspeed_round_trip_job, 2, args=(str(tmp_path),), timeout=900
    )
    for stage in async_ckpt_workers.DEEPSPEED_STAGES:
        for rank in ranks:
            result = rank[stage]
            assert _same(result["loaded"], result["expected"]), f"ZeRO-{stage}"
            assert result["losses_after_load"] == pytest.approx(
                result["losses_after_save"], abs=1e-6
            )
        assert ranks[0][stage]["returned_before_commit"]
        files = ranks[0][stage]["files"]
        assert sum(name.endswith("optim_states.pt") for name in files) == 2, files


@needs_deepspeed
def test_deepspeed_kill_during_background_write_leaves_previous_checkpoint_newest(tmp_path):
    with pytest.raises(WorkerFailedError, match=r"code -9"):
        spawn_workers(
            async_ckpt_workers.deepspeed_save_then_die_job,
            2,
            args=(str(tmp_path),),
            timeout=900,
            reuse=False,
        )
    first = Path((tmp_path / "first.txt").read_text())
    checkpoints = tmp_path / "checkpoints"
    for rank in (0, 1):
        assert len(json.loads((tmp_path / f"trained_rank{rank}.json").read_text())) == 2
        held = json.loads((tmp_path / f"held_rank{rank}").read_text())
        assert any(name.endswith("optim_states.pt") for name in held), held
    hidden = [p for p in checkpoints.iterdir() if p.name.startswith(".checkpoint_1.accel-tmp-")]
    assert hidden, "the killed save left its temporary folder (and nothing public)"
    assert not (checkpoints / "checkpoint_1").exists()
    assert latest_checkpoint(checkpoints) == first
    # Resumed on 3 processes: the previous checkpoint, through DeepSpeed's universal format.
    resumed = spawn_workers(
        async_ckpt_workers.deepspeed_resume_job, 3, args=(str(tmp_path),), timeout=900
    )
    for rank in resumed:
        assert rank["latest"] == str(first)
        assert rank["state_equal"]
