"""Asynchronous saves (``save_state(blocking=False)``) under FSDP, meshes and DeepSpeed, in spawned workers."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fsdp_workers import CKPT_SIZE, TinyLM, _continue, _project, plugin, train
from safetensors.torch import load_file, save_file

HOLD_VARIABLE = "ACCEL_CKPT_TEST_HOLD_AFTER_SHARDS"
CONFIGS = {
    "fsdp2_sharded": (2, "SHARDED_STATE_DICT"),
    "fsdp1_sharded": (1, "SHARDED_STATE_DICT"),
    "fsdp2_full": (2, "FULL_STATE_DICT"),
}


def _fresh_prepared(folder: str, version: int, kind: str) -> tuple[Any, Any, Any]:
    accelerator = _project(folder, fsdp_plugin=plugin(version, state_dict_type=kind))
    torch.manual_seed(1)
    model = TinyLM()  # other initial weights: the load must overwrite them
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # as train() has
    model, optimizer, _ = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer


def _equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)


def round_trip_job(folder: str) -> dict[str, Any]:
    """Per config: train, save with blocking=False, keep training (collectives on the default
    group while the write runs), wait, load into a fresh model: weights and the continued losses
    equal those of the state at the save."""
    results: dict[str, Any] = {}
    for name, (version, kind) in CONFIGS.items():
        where = f"{folder}/{name}"
        accelerator = _project(where, fsdp_plugin=plugin(version, state_dict_type=kind))
        first = train(accelerator, 2, CKPT_SIZE)
        model, optimizer = first["model"], first["optimizer"]
        expected = accelerator.get_state_dict(model)
        handle = accelerator.save_state(blocking=False)
        returned_before_commit = not Path(handle.path).exists() or not handle.done()
        after = _continue(accelerator, model, optimizer, first_step=2, steps=2)
        saved = handle.wait()

        accelerator, second, second_optimizer = _fresh_prepared(where, version, kind)
        accelerator.load_state(saved)
        loaded = accelerator.get_state_dict(second)
        resumed = _continue(accelerator, second, second_optimizer, first_step=2, steps=2)
        results[name] = {
            "weights_equal": (not accelerator.is_main_process) or _equal(loaded, expected),
            "losses_after_save": after,
            "losses_after_load": resumed,
            "returned_before_commit": returned_before_commit,
            "files": sorted(p.name for p in Path(saved, "fsdp_model_0").iterdir()),
        }
    return results


def save_then_die_job(folder: str) -> None:
    """2 processes: an asynchronous save that completes (checkpoint_0, its weights written to
    expected.safetensors), one more step, then a second asynchronous save whose background write
    is held after the shards are written (test hook); training goes on, then both ranks die by
    SIGKILL while the write is pending."""
    accelerator = _project(folder, fsdp_plugin=plugin(2))
    first = train(accelerator, 2, CKPT_SIZE)
    model, optimizer = first["model"], first["optimizer"]
    expected = accelerator.get_state_dict(model)
    saved = accelerator.save_state(blocking=False).wait()
    if accelerator.is_main_process:
        save_file(
            {k: v.contiguous() for k, v in expected.items()}, f"{folder}/expected.safetensors"
        )
        Path(folder, "first.txt").write_text(str(saved))
    _continue(accelerator, model, optimizer, first_step=2, steps=1)
    _save_train_and_die_while_held(
        accelerator, folder, lambda: _continue(accelerator, model, optimizer, first_step=3, steps=2)
    )


def _save_train_and_die_while_held(
    accelerator: Any, folder: str, train_more: Callable[[], list[float]]
) -> None:
    """Start a background save held after its files are written (test hook), train on with
    ``train_more``, wait until every rank's write is held, record the losses, die by SIGKILL."""
    os.environ[HOLD_VARIABLE] = folder
    accelerator.save_state(blocking=False)
    losses = train_more()
    markers = [Path(folder, f"held_rank{rank}") for rank in range(accelerator.num_processes)]
    deadline = time.monotonic() + 300
    while not all(marker.exists() for marker in markers):
        if time.monotonic() > deadline:
            raise TimeoutError("The background writes never reached the hold point.")
        time.sleep(0.05)
    Path(folder, f"trained_rank{accelerator.process_index}.json").write_text(json.dumps(losses))
    os.kill(os.getpid(), signal.SIGKILL)


def resume_job(folder: str) -> dict[str, Any]:
    """Load the newest complete checkpoint after the kill; compare with the first save's state."""
    accelerator, model, _ = _fresh_prepared(folder, 2, "SHARDED_STATE_DICT")
    latest = accelerator.latest_checkpoint()
    accelerator.load_state()
    loaded = accelerator.get_state_dict(model)
    equal = True
    if accelerator.is_main_process:
        equal = _equal(loaded, load_file(f"{folder}/expected.safetensors"))
    return {"latest": str(latest), "weights_equal": equal}


def nd_round_trip_job(folder: str) -> dict[str, Any]:
    """4 processes, dp_shard 2 x tp 2 (a 2-D mesh): an asynchronous save while the next epoch
    trains; loaded into a fresh model, the weights and that epoch's losses are the same."""
    import nd_workers
    from nd_workers import PLAN, fresh, prepare, run_epoch

    from accel import ParallelismConfig, TorchTensorParallelConfig

    def config() -> ParallelismConfig:
        handler = TorchTensorParallelConfig(plan=PLAN)
        return ParallelismConfig(dp_shard_size=2, tp_size=2, tp_handler=handler)

    accelerator = fresh(config())
    model, optimizer, train_loader, _, _ = prepare(accelerator)
    run_epoch(accelerator, model, optimizer, train_loader)
    expected = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
    handle = accelerator.save_state(f"{folder}/nd", blocking=False)
    after = run_epoch(accelerator, model, optimizer, train_loader)["losses"]
    saved = handle.wait()

    accelerator = fresh(config())
    torch.manual_seed(1)
    model, optimizer, train_loader, _, _ = prepare(accelerator)
    accelerator.load_state(saved)
    loaded = accelerator.get_state_dict(model)
    resumed = run_epoch(accelerator, model, optimizer, train_loader)["losses"]
    nd_workers.AcceleratorState._reset_state()
    return {
        "weights_equal": (not accelerator.is_main_process) or _equal(loaded, expected),
        "losses_after_save": after,
        "losses_after_load": resumed,
    }


# ---------------------------------------------------------------------- DeepSpeed ZeRO-1/2/3
DEEPSPEED_STAGES = (1, 2, 3)
DEEPSPEED_FIRST_STEPS = 6


def _deepspeed_steps(
    accelerator: Any, model: Any, optimizer: Any, batches: Any, steps: int
) -> list[float]:
    """``steps`` optimizer steps; the mean loss over processes of each."""
    import elastic_matrix_workers as matrix

    losses = []
    for _ in range(steps):
        loss = matrix.train_step(accelerator, model, optimizer, next(batches))
        losses.append(float(accelerator.reduce(loss, reduction="mean")))
    return losses


def deepspeed_round_trip_job(folder: str) -> dict[int, dict[str, Any]]:
    """Per ZeRO stage, 2 processes: train, save with blocking=False, train 2 more steps while the
    write runs, wait; a fresh engine loads the checkpoint: the gathered full state is the one at
    the save (bit-equal) and the next 2 steps give the same losses."""
    import elastic_matrix_workers as matrix

    results: dict[int, dict[str, Any]] = {}
    for stage in DEEPSPEED_STAGES:
        accelerator, model, optimizer, loader = matrix.setup(f"zero{stage}", 2)
        batches = iter(loader)
        _deepspeed_steps(accelerator, model, optimizer, batches, DEEPSPEED_FIRST_STEPS)
        expected = matrix.deepspeed_full_state(accelerator, model, optimizer)
        handle = accelerator.save_state(f"{folder}/zero{stage}", blocking=False)
        returned_before_commit = not Path(handle.path).exists() or not handle.done()
        after = _deepspeed_steps(accelerator, model, optimizer, batches, 2)
        saved = handle.wait()
        matrix.teardown(accelerator)

        accelerator, model, optimizer, loader = matrix.setup(f"zero{stage}", 2)
        accelerator.load_state(saved)
        loaded = matrix.deepspeed_full_state(accelerator, model, optimizer)
        resumed = _deepspeed_steps(accelerator, model, optimizer, iter(loader), 2)
        matrix.teardown(accelerator)
        results[stage] = {
            "expected": expected,
            "loaded": loaded,
            "losses_after_save": after,
            "losses_after_load": resumed,
            "returned_before_commit": returned_before_commit,
            "files": sorted(p.name for p in Path(saved, "deepspeed", "engine").iterdir()),
        }
    return results


def deepspeed_save_then_die_job(folder: str) -> None:
    """ZeRO-3 on 2 processes: an asynchronous save that completes (checkpoint_0, its full state
    in expected.pt), one more step, then a second one whose background write is held once its
    files are written (test hook); training goes on, then both ranks die by SIGKILL."""
    import elastic_matrix_workers as matrix

    accelerator, model, optimizer, loader = matrix.setup("zero3", 2, project_dir=folder)
    batches = iter(loader)
    _deepspeed_steps(accelerator, model, optimizer, batches, 2)
    expected = matrix.deepspeed_full_state(accelerator, model, optimizer)
    saved = accelerator.save_state(blocking=False).wait()
    if accelerator.is_main_process:
        torch.save(expected, f"{folder}/expected.pt")
        Path(folder, "first.txt").write_text(str(saved))
    _deepspeed_steps(accelerator, model, optimizer, batches, 1)
    _save_train_and_die_while_held(
        accelerator, folder, lambda: _deepspeed_steps(accelerator, model, optimizer, batches, 2)
    )


def deepspeed_resume_job(folder: str) -> dict[str, Any]:
    """Load the newest complete checkpoint after the kill (on any number of processes)."""
    import elastic_matrix_workers as matrix

    world_size = matrix.dist_world_size()
    accelerator, model, optimizer, _ = matrix.setup("zero3", world_size, project_dir=folder)
    latest = accelerator.latest_checkpoint()
    accelerator.load_state()
    loaded = matrix.deepspeed_full_state(accelerator, model, optimizer)
    expected = torch.load(f"{folder}/expected.pt", weights_only=True)
    matrix.teardown(accelerator)
    return {"latest": str(latest), "state_equal": _equal(loaded, expected)}
