"""Every FSDP2 path that reads parameters, after every kind of last forward (spawned workers).

A prepared FSDP2 root keeps its gathered parameters after a forward that has no backward. Each
cell of this job takes one wrap policy and one kind of last forward, then reads the model through
every public path and compares what it got with the truth: the full weights and gradients
assembled from the sharded ``DTensor`` parameters the optimizer steps.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import torch
from fsdp_workers import fresh, global_batch, lm_loss, make_model, plugin
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from accel import Accelerator

SIZE = 4


def _train_step(accelerator: Accelerator, model: Any, optimizer: Any, step: int) -> None:
    tokens = _tokens(accelerator, step)
    with accelerator.accumulate(model):
        accelerator.backward(lm_loss(model, tokens))
        optimizer.step()
        optimizer.zero_grad()


def _tokens(accelerator: Accelerator, step: int, size: int = SIZE) -> torch.Tensor:
    rank, world = accelerator.process_index, accelerator.num_processes
    share = size // world
    return global_batch(step, size)[rank * share : (rank + 1) * share]


def _last_train_step(accelerator: Accelerator, model: Any, optimizer: Any) -> None:
    """Forward, backward and step: the root is resharded by backward."""
    _train_step(accelerator, model, optimizer, 1)


def _no_grad_evaluation(accelerator: Accelerator, model: Any, optimizer: Any) -> None:
    """A backward, then an evaluation pass under no_grad: the root stays gathered."""
    accelerator.backward(lm_loss(model, _tokens(accelerator, 2)))
    with torch.no_grad():
        lm_loss(model, _tokens(accelerator, 3))


def _eval_mode_batches(accelerator: Accelerator, model: Any, optimizer: Any) -> None:
    """A backward, then ``model.eval()`` forwards of two batch sizes with autograd on."""
    accelerator.backward(lm_loss(model, _tokens(accelerator, 4)))
    model.eval()
    for size in (6, 2):
        model(_tokens(accelerator, 5, size)[:, :-1])
    model.train()


def _mid_accumulation(accelerator: Accelerator, model: Any, optimizer: Any) -> None:
    """The first micro-step of two: forward and backward without gradient synchronisation."""
    if accelerator.step % accelerator.gradient_accumulation_steps:
        _train_step(accelerator, model, optimizer, 6)  # finish the pending step first
    with accelerator.accumulate(model):
        accelerator.backward(lm_loss(model, _tokens(accelerator, 6)))
        assert not accelerator.sync_gradients
        optimizer.step()  # not a real step yet: the Accelerator skips it
        optimizer.zero_grad()


LAST_FORWARDS: dict[str, Callable[[Accelerator, Any, Any], None]] = {
    "train_step": _last_train_step,
    "no_grad_eval": _no_grad_evaluation,
    "eval_mode_batches": _eval_mode_batches,
    "mid_accumulation": _mid_accumulation,
}

POLICIES: dict[str, dict[str, Any]] = {
    "no_wrap": {"auto_wrap_policy": "no_wrap", "transformer_cls_names_to_wrap": None},
    "block_wrap": {},
}


def _truth(names: list[str], shards: list[torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
    """Full weights and the global gradient norm, assembled from the optimizer's shards."""
    weights = {
        name: shard.full_tensor().detach().clone()
        for name, shard in zip(names, shards, strict=True)
    }
    squares = torch.zeros(())
    for shard in shards:
        if shard.grad is not None:
            squares += shard.grad.full_tensor().double().pow(2).sum()
    return weights, float(squares.sqrt())


def _same(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    return left.keys() == right.keys() and all(
        torch.equal(left[name].cpu(), right[name].cpu()) for name in left
    )


def _full(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        name: value.full_tensor() if isinstance(value, DTensor) else value
        for name, value in state.items()
    }


def _cell(folder: pathlib.Path, policy: str, last_forward: str) -> dict[str, Any]:
    """One wrap policy and one kind of last forward, read through every path."""
    accelerator = fresh(fsdp_plugin=plugin(2, **POLICIES[policy]), gradient_accumulation_steps=2)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    names = [name for name, _ in model.named_parameters()]
    shards = list(model.parameters())  # what the optimizer steps
    _train_step(accelerator, model, optimizer, 0)
    _train_step(accelerator, model, optimizer, 0)  # two micro-steps: one real optimizer step

    def last_forward_then_truth() -> tuple[dict[str, torch.Tensor], float]:
        LAST_FORWARDS[last_forward](accelerator, model, optimizer)
        return _truth(names, shards)

    result: dict[str, Any] = {}
    weights, _ = last_forward_then_truth()
    result["get_state_dict"] = _same(accelerator.get_state_dict(model), weights)

    weights, _ = last_forward_then_truth()
    raw = accelerator.get_state_dict(model, unwrap=False)
    result["get_state_dict_raw"] = all(isinstance(v, DTensor) for v in raw.values()) and _same(
        _full(raw), weights
    )

    weights, _ = last_forward_then_truth()
    unwrapped = accelerator.unwrap_model(model)
    result["unwrap_model"] = all(
        isinstance(parameter, DTensor) for parameter in unwrapped.parameters()
    ) and _same(_full(unwrapped.state_dict()), weights)

    # Clipping sees every gradient the optimizer will step, whatever parameters() names now.
    _, grad_norm = last_forward_then_truth()
    norm = float(accelerator.clip_grad_norm_(model.parameters(), max_norm=1e6))
    result["clip_grad_norm_"] = abs(norm - grad_norm) <= 1e-5 * max(grad_norm, 1.0)
    result["clip_norm_and_truth"] = [norm, grad_norm]
    accelerator.clip_grad_value_(model.parameters(), 1e-4)
    largest = max(
        (float(shard.grad.full_tensor().abs().max()) for shard in shards if shard.grad is not None),
        default=0.0,
    )
    result["clip_grad_value_"] = largest <= 1e-4

    weights, _ = last_forward_then_truth()
    target = folder / f"{policy}-{last_forward}"
    accelerator.save_model(model, target / "model")
    if accelerator.is_main_process:
        result["save_model"] = _same(
            load_file(str(target / "model" / "model.safetensors")), weights
        )

    weights, _ = last_forward_then_truth()
    accelerator.save_state(target / "state")
    _train_step(accelerator, model, optimizer, 7)  # move away from the saved state
    _train_step(accelerator, model, optimizer, 7)
    last_forward_then_truth()
    accelerator.load_state(target / "state")
    loaded, _ = _truth(names, shards)
    result["save_state_then_load_state"] = _same(loaded, weights)
    optimizer_state = optimizer.state_dict()["state"]
    result["optimizer_state_restored"] = bool(optimizer_state) and all(
        isinstance(value, DTensor)
        for entry in optimizer_state.values()
        for key, value in entry.items()
        if key != "step"
    )
    return result


def _optimizer_built_after_evaluation() -> bool:
    """An optimizer built on ``parameters()`` right after an evaluation pass trains the shards."""
    accelerator = fresh(fsdp_plugin=plugin(2, **POLICIES["no_wrap"]))
    model = accelerator.prepare(make_model())
    with torch.no_grad():
        lm_loss(model, _tokens(accelerator, 0))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.5))
    before = model.head.weight.full_tensor().clone()
    accelerator.backward(lm_loss(model, _tokens(accelerator, 1)))
    optimizer.step()
    return not torch.equal(before, model.head.weight.full_tensor())


def read_paths_job(folder: str) -> dict[str, Any]:
    """Every cell of policies x last forwards, plus the optimizer built after an evaluation."""
    results: dict[str, Any] = {
        f"{policy}/{last_forward}": _cell(pathlib.Path(folder), policy, last_forward)
        for policy in POLICIES
        for last_forward in LAST_FORWARDS
    }
    results["optimizer_built_after_evaluation_trains"] = _optimizer_built_after_evaluation()
    results["exit_hook"] = _exit_hook_frees_the_group()
    return results


def _exit_hook_frees_the_group() -> dict[str, Any]:
    """The exit hook destroys the group and leaves no reference to it in sharded models."""
    import torch.distributed as dist

    from accel_state.group_keeper import free_destroyed_groups
    from accel_state.process_group import release_group_references, stop_at_exit

    accelerator = fresh(fsdp_plugin=plugin(2))
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    _train_step(accelerator, model, optimizer, 0)
    stop_at_exit()  # what a normal interpreter exit runs
    free_destroyed_groups()
    return {
        "group_destroyed": not dist.is_initialized(),
        "references_left": release_group_references(model, optimizer.state_dict()),
    }
