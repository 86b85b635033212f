"""Sharded FSDP checkpoints: saved on 2 processes, loaded on 3, merged offline, kill-safe."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import fsdp_workers
import pytest
import torch
from safetensors.torch import load_file

from accel_ckpt import load_checkpoint_in_model
from accel_ckpt.cli import merge_weights_command
from accel_state.testing import WorkerFailedError, spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = [pytest.mark.timeout(900), pytest.mark.torch_feature("fsdp2")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("fsdp_ckpt")
    with pytest.raises(WorkerFailedError, match=r"Rank 1 of 2 failed first:\n.*code -9"):
        spawn_workers(fsdp_workers.save_then_die_job, 2, args=(str(folder),), timeout=600)
    two = [json.loads((folder / f"run_rank{rank}.json").read_text()) for rank in (0, 1)]
    three = spawn_workers(fsdp_workers.resume_job, 3, args=(str(folder),), timeout=600)
    return {"folder": folder, "two": two, "three": three}


def test_resumed_on_three_processes_the_losses_equal_the_uninterrupted_two_process_run(runs):
    uninterrupted = runs["two"][0]["losses"]
    assert uninterrupted == runs["two"][1]["losses"]
    assert uninterrupted == pytest.approx(
        fsdp_workers.reference_losses(2, 6, 1e-2, first_step=2), abs=1e-5
    )
    for rank in runs["three"]:
        assert rank["losses"] == pytest.approx(uninterrupted, rel=1e-5, abs=1e-5)
        # Each of 3 ranks holds about a third of the weights (dim-0 chunks of small tensors are
        # uneven: 16 rows split 6, 6, 4), and together exactly all of them.
        assert abs(rank["local"] - rank["total"] / 3) <= 0.15 * rank["total"] / 3
    assert sum(rank["local"] for rank in runs["three"]) == runs["three"][0]["total"]


def test_each_rank_wrote_its_own_shards_into_the_checkpoint(runs):
    files = runs["two"][0]["sharded_files"]
    assert ".metadata" in files
    assert sum(name.endswith(".distcp") for name in files) == 2  # one file per rank


def test_a_kill_during_the_second_save_leaves_the_first_checkpoint_the_newest(runs):
    checkpoints = runs["folder"] / "checkpoints"
    newest = Path(runs["two"][0]["checkpoint"])
    assert newest.parent == checkpoints
    # The killed save published nothing: the newest complete checkpoint is still the first one,
    # and the 3-process run above loaded it.
    from accel_ckpt import latest_checkpoint

    assert latest_checkpoint(checkpoints) == newest


def test_merge_weights_equals_get_state_dict_of_the_live_model(runs, tmp_path):
    folder = runs["folder"]
    checkpoint = runs["two"][0]["checkpoint"]
    # Through the accel CLI, which finds merge-weights in accel-ckpt's entry points.
    command = [
        sys.executable,
        "-m",
        "accel_launch.cli",
        "merge-weights",
        checkpoint,
        str(tmp_path / "merged"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    live = load_file(str(folder / "live.safetensors"))
    assert sorted(merged) == sorted(live) == runs["three"][0]["keys"]
    for name, tensor in live.items():
        assert torch.equal(merged[name], tensor), name
    # The full weights load into a plain torch module.
    plain = fsdp_workers.TinyLM()
    plain.load_state_dict(merged)
    # save_model wrote the same weights, sharded with an index (8KB shards).
    saved = folder / "saved_model"
    assert (saved / "model.safetensors.index.json").exists()
    reloaded = fsdp_workers.TinyLM()
    load_checkpoint_in_model(reloaded, saved)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, live[name]), name


def test_merge_weights_names_a_folder_without_shards(tmp_path, capsys):
    args = argparse.Namespace(
        checkpoint_dir=str(tmp_path),
        output_dir=str(tmp_path / "out"),
        max_shard_size="10GB",
        unsafe_serialization=False,
    )
    assert merge_weights_command(args) == 1
    assert "holds no sharded model state" in capsys.readouterr().err


def test_full_state_dict_checkpoint_round_trips_through_rank_zero(runs):
    rank0 = runs["three"][0]
    assert rank0["full_files"] == ["model.safetensors", "optimizer.pt"]
    assert rank0["full_round_trip"] is True


def test_a_full_state_dict_of_an_optimizer_without_state_loads_on_fsdp2(runs):
    # Plain SGD keeps no per-parameter state; torch's full optimizer load cannot place it.
    for rank in runs["three"]:
        assert rank["stateless_round_trip"] == {"weights": True, "lr": 0.05}
