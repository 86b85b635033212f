"""Scripts written as for Accelerate, run on spawned processes by test_api_semantics.py."""

from __future__ import annotations

import copy
import json
import logging
import pathlib

import switch_training as run
import torch
import torch.distributed as dist

import accel.utils
from accel import Accelerator
from accel.logging import get_logger
from accel.utils import extract_model_from_parallel, find_executable_batch_size


def clip_every_micro_step(max_norm: float) -> dict:
    """Clip and log the norm on every micro-step, beside a hand-written Accelerate reference."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    norms, reference_norms = [], []
    for step in range(6):
        inputs = torch.full((2, 3), float(rank + step + 1))
        with accelerator.accumulate(model):
            accelerator.backward(model(inputs).sum() * 10)
            norms.append(accelerator.clip_grad_norm_(model.parameters(), max_norm).item())
            optimizer.step()
            optimizer.zero_grad()
        # Accelerate's semantics by hand: local gradients on micro-steps, averaged on sync steps.
        (reference(inputs).sum() * 10 / 2).backward()
        sync = step % 2 == 1
        if sync and world > 1:
            for parameter in reference.parameters():
                dist.all_reduce(parameter.grad)
                parameter.grad /= world
        reference_norms.append(
            torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm).item()
        )
        if sync:
            reference_optimizer.step()
            reference_optimizer.zero_grad()
    value_clipped = []
    with accelerator.accumulate(model):  # a micro-step again: clip_grad_value_ clamps it too
        accelerator.backward(model(torch.ones(2, 3)).sum() * 10)
        accelerator.clip_grad_value_(model.parameters(), 0.01)
        value_clipped = [p.grad.abs().max().item() for p in model.parameters()]
    return {
        "norms": norms,
        "reference_norms": reference_norms,
        "weights": [
            p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()
        ],
        "reference_weights": [p.detach().flatten().tolist() for p in reference.parameters()],
        "value_clipped": value_clipped,
    }


def keyword_names() -> dict:
    """Operations called with Accelerate's keyword names, on the Accelerator and accel.utils."""
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    mine = torch.tensor([float(rank)])
    ragged = torch.ones(rank + 1)
    return {
        "gather": accelerator.gather(tensor=mine).tolist(),
        "reduce": accelerator.reduce(tensor=mine, reduction="sum").tolist(),
        "pad": accelerator.pad_across_processes(tensor=ragged, dim=0, pad_index=-1).tolist(),
        "utils_gather": accel.utils.gather(tensor=mine).tolist(),
        "utils_reduce": accel.utils.reduce(tensor=mine + 1, reduction="mean").tolist(),
        "utils_broadcast": accel.utils.broadcast(tensor=mine.clone(), from_process=0).tolist(),
        "utils_pad": accel.utils.pad_across_processes(tensor=ragged, pad_index=-1).tolist(),
        "utils_send": accel.utils.send_to_device(tensor=[mine], device="cpu")[0].tolist(),
        "utils_objects": accel.utils.gather_object(object=[rank]),
    }


def small_semantics() -> dict:
    """find_executable_batch_size, get_logger, unwrap_model, split_between_processes, save_state."""
    accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    rank = accelerator.process_index
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def fit(batch_size: int) -> int:
        tried.append(batch_size)
        if batch_size > 50:
            raise RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    out: dict = {"first": fit(), "second": fit(), "tried": tried}
    logger = get_logger(f"semantics.{rank}")
    out["log_level"] = logging.getLevelName(logger.logger.level)
    raw = torch.nn.Linear(2, 2)
    prepared = accelerator.prepare(raw)
    kept = accelerator.unwrap_model(prepared)
    out["compiled_kept"] = type(kept).__name__
    out["kept_wraps_raw"] = kept._orig_mod is raw
    out["prepared_untouched"] = type(prepared._orig_mod).__name__
    out["plain_is_raw"] = accelerator.unwrap_model(prepared, keep_torch_compile=False) is raw
    out["extract_plain_is_raw"] = (
        extract_model_from_parallel(prepared, keep_torch_compile=False) is raw
    )
    full = accelerator.get_state_dict(prepared)
    out["state_dict_keys"] = sorted(full)
    out["state_dict_equal"] = all(torch.equal(full[k], v) for k, v in raw.state_dict().items())
    out["wrapped_keys"] = sorted(accelerator.get_state_dict(prepared, unwrap=False))
    with accelerator.split_between_processes("abcde") as share:
        out["string"] = share
    return out


def per_rank_folders(root: str) -> dict:
    """Each rank saves to its own folder and loads it back, as some Accelerate scripts do."""
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(2, 3) * (rank + 1)).sum())
    optimizer.step()
    optimizer.zero_grad()
    saved = [p.detach().clone() for p in model.parameters()]
    path = accelerator.save_state(pathlib.Path(root) / f"rank{rank}")
    accelerator.backward(model(torch.ones(2, 3)).sum())
    optimizer.step()
    accelerator.load_state(pathlib.Path(root) / f"rank{rank}")
    return {
        "returned": type(path).__name__,
        "path": str(path),
        "files": sorted(p.name for p in path.iterdir()),
        "restored": all(torch.equal(a, b) for a, b in zip(saved, model.parameters(), strict=True)),
    }


def resume_from_accelerate(folder: str, scratch: str) -> dict:
    """Load a checkpoint real Accelerate wrote, go on training, then save and reload in accel's format."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=run.ACCUMULATION)
    objects = accelerator.prepare(*run.build())
    counter = run.Counter()
    accelerator.register_for_checkpointing(counter)
    try:
        accelerator.load_state(folder)
        refusal = ""
    except Exception as error:  # noqa: BLE001 - the test checks the message
        refusal = f"{type(error).__name__}: {error}"
    accelerator.load_state(folder, allow_pickle=True)
    state = run.snapshot(accelerator, objects, counter)
    draws = run.draws()
    losses = run.train(accelerator, objects, run.STEPS_AFTER)
    weights = run.weights(accelerator, objects)
    saved = accelerator.save_state(scratch)
    counter.value = 0
    accelerator.load_state(saved)
    return {
        "refusal": refusal,
        "state": json.loads(json.dumps(state)),
        "draws": draws,
        "losses_after": losses,
        "weights_after": weights,
        "resaved": sorted(p.name for p in saved.iterdir()),
        "counter_after_reload": counter.value,
        "weights_after_reload": run.weights(accelerator, objects),
    }
