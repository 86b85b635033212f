"""FSDP training functions run inside spawned worker processes (importable by module name)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel_state import reset_state

VOCAB, DIM, SEQ = 32, 16, 6


class Block(torch.nn.Module):
    """A pre-norm transformer block: self-attention and an MLP, each with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(), torch.nn.Linear(2 * DIM, DIM)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-1, -2) / DIM**0.5, dim=-1)
        x = x + self.proj(attention @ v)
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    """Embedding, two blocks, a head: a next-token model small enough for CPU tests."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM()


def global_batch(step: int, size: int) -> torch.Tensor:
    """The tokens of optimizer step ``step``: the same on every rank and in every run."""
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (size, SEQ + 1), generator=generator)


def lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1)
    )


def reference_losses(steps: int, size: int, lr: float, first_step: int = 0) -> list[float]:
    """One process, no library: AdamW on the mean loss of each whole global batch."""
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(first_step + steps):
        loss = lm_loss(model, global_batch(step, size))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= first_step:
            losses.append(loss.item())
    return losses


def plugin(version: int, **overrides: Any) -> FullyShardedDataParallelPlugin:
    settings: dict[str, Any] = {
        "fsdp_version": version,
        "auto_wrap_policy": "transformer_based_wrap",
        "transformer_cls_names_to_wrap": ["Block"],
    }
    settings.update(overrides)
    return FullyShardedDataParallelPlugin(**settings)


def train(
    accelerator: Accelerator,
    steps: int,
    size: int,
    lr: float = 1e-2,
    accumulation: int = 1,
    clip: float | None = None,
    model: torch.nn.Module | None = None,
    first_step: int = 0,
) -> dict[str, Any]:
    """The user's loop: prepare, then ``steps`` optimizer steps on this rank's share of each batch.

    Returns the global mean losses per optimizer step, the clip norms, the local shard sizes.
    """
    model = model if model is not None else make_model()
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # built before prepare
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    rank, world = accelerator.process_index, accelerator.num_processes
    share = size // world
    losses, norms = [], []
    for step in range(steps):
        tokens = global_batch(first_step + step, size)[rank * share : (rank + 1) * share]
        tokens = tokens.to(accelerator.device)
        micro = share // accumulation
        step_loss = torch.zeros((), device=accelerator.device)
        for index in range(accumulation):
            with accelerator.accumulate(model):
                loss = lm_loss(model, tokens[index * micro : (index + 1) * micro])
                accelerator.backward(loss)
                step_loss += loss.detach() / accumulation
                if clip is not None and accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), clip)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        losses.append(accelerator.reduce(step_loss, reduction="mean").item())
    local = sum(_local(p).numel() for p in model.parameters())
    return {
        "losses": losses,
        "norms": norms,
        "local": local,
        "total": total,
        "type": accelerator.distributed_type.value,
        "model": model,
        "optimizer": optimizer,
    }


def _local(parameter: torch.Tensor) -> torch.Tensor:
    to_local = getattr(parameter, "to_local", None)
    return to_local() if to_local is not None else parameter


def fresh(**kwargs: Any) -> Accelerator:
    """A new Accelerator in a process that may have had one (the process group stays)."""
    reset_state(stop_process_group=False)
    return Accelerator(**kwargs)


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("model", "optimizer")}


def parity_job(size: int, steps: int) -> dict[str, Any]:
    """DDP, FSDP2, FSDP1 (transformer wrap), FSDP2 size-based with clipping, accumulation, bf16."""
    out: dict[str, Any] = {}
    out["ddp"] = _strip(train(fresh(), steps, size, clip=0.5))
    out["fsdp2"] = _strip(train(fresh(fsdp_plugin=plugin(2)), steps, size, clip=0.5))
    out["fsdp1"] = _strip(train(fresh(fsdp_plugin=plugin(1)), steps, size, clip=0.5))
    out["fsdp2_size"] = _strip(
        train(
            fresh(fsdp_plugin=plugin(2, auto_wrap_policy="size_based_wrap", min_num_params=500)),
            steps,
            size,
        )
    )
    out["fsdp2_accumulate"] = _strip(
        train(
            fresh(fsdp_plugin=plugin(2), gradient_accumulation_steps=2), steps, size, accumulation=2
        )
    )
    out["fsdp1_accumulate"] = _strip(
        train(
            fresh(fsdp_plugin=plugin(1), gradient_accumulation_steps=2), steps, size, accumulation=2
        )
    )
    out["fsdp2_offload_ac"] = _strip(
        train(
            fresh(fsdp_plugin=plugin(2, cpu_offload=True, activation_checkpointing=True)),
            steps,
            size,
        )
    )
    out["bf16"] = _strip(
        train(fresh(fsdp_plugin=plugin(2), mixed_precision="bf16"), 6, size, lr=3e-2)
    )
    out["errors"] = _error_messages(size)
    out["gathered_between_forward_and_backward"] = _gathered_after_forward(size)
    return out


def _gathered_after_forward(size: int) -> dict[str, dict[str, bool]]:
    """Which parameters stay gathered (plain tensors, not DTensor shards) after forward.

    For the Accelerator under FULL_SHARD and SHARD_GRAD_OP, and for ``fully_shard`` by hand with
    torch's defaults (the reference for how many all-gathers a step costs).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    def gathered(model: torch.nn.Module) -> dict[str, bool]:
        loss = lm_loss(model, global_batch(0, size))
        state = {
            "root": not isinstance(model.head.weight, DTensor),
            "layer": not isinstance(model.blocks[0].qkv.weight, DTensor),
        }
        loss.backward()
        return state

    out = {}
    for name, strategy in (("full_shard", "FULL_SHARD"), ("shard_grad_op", "SHARD_GRAD_OP")):
        accelerator = fresh(fsdp_plugin=plugin(2, sharding_strategy=strategy))
        out[name] = gathered(accelerator.prepare(make_model()))
    by_hand = make_model()
    for block in by_hand.blocks:
        fully_shard(block)
    fully_shard(by_hand)
    out["by_hand"] = gathered(by_hand)
    return out


def _error_messages(size: int) -> dict[str, str]:
    """The messages of the documented misconfigurations."""
    messages = {}
    try:
        train(fresh(fsdp_plugin=plugin(2, transformer_cls_names_to_wrap=["NoSuchLayer"])), 1, size)
    except Exception as error:  # noqa: BLE001 - the message is what the test checks
        messages["layer"] = f"{type(error).__name__}: {error}"
    accelerator = fresh(fsdp_plugin=plugin(2))
    model = make_model()
    stranger = torch.optim.SGD(copy.deepcopy(make_model()).parameters(), lr=0.1)
    try:
        accelerator.prepare(model, stranger)
    except Exception as error:  # noqa: BLE001
        messages["optimizer"] = f"{type(error).__name__}: {error}"
    return messages


def launched_script_losses(size: int, steps: int) -> dict[str, Any]:
    """Body of the script started by ``accel launch``: FSDP from the launcher's settings only."""
    accelerator = Accelerator()
    result = _strip(train(accelerator, steps, size))
    from accel.strategies.fsdp.strategy import FSDPStrategy

    strategy = accelerator.strategy
    assert isinstance(strategy, FSDPStrategy)
    result["fsdp_version"] = strategy.fsdp.fsdp_version
    result["layers"] = list(strategy.fsdp.layer_class_names)
    result["rank"] = accelerator.process_index
    result["reference"] = reference_losses(steps, size, 1e-2)
    accelerator.end_training()
    return result


def cuda_job(size: int, steps: int) -> dict[str, Any]:
    """World size 1 FSDP2 on a GPU: a one-process NCCL group, then the ordinary loop."""
    import torch.distributed as dist

    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    result = _strip(train(fresh(fsdp_plugin=plugin(2)), steps, size))
    result["reference"] = reference_losses(steps, size, 1e-2)
    return result


CKPT_SIZE = 6  # global batch: divisible by 2 and 3 processes


def _project(folder: str, **kwargs: Any) -> Accelerator:
    from accel_ckpt import ProjectConfiguration

    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True)
    return fresh(project_config=config, **kwargs)


def save_then_die_job(folder: str) -> None:
    """2 processes: train 2 steps, save a sharded checkpoint, train 2 more (written to files),
    then start a second save in which rank 1 is killed with SIGKILL after writing its shards."""
    import json
    import os
    import signal
    from pathlib import Path

    from accel.strategies.fsdp import checkpoint as fsdp_checkpoint

    accelerator = _project(folder, fsdp_plugin=plugin(2))
    result = train(accelerator, 2, CKPT_SIZE)
    model, optimizer = result["model"], result["optimizer"]
    saved = accelerator.save_state()
    full = accelerator.get_state_dict(model)
    rank = accelerator.process_index
    if rank == 0:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in full.items()}, str(Path(folder) / "live.safetensors")
        )
    accelerator.save_model(model, str(Path(folder) / "saved_model"), max_shard_size="8KB")
    report = {
        "checkpoint": str(saved),
        "sharded_files": sorted(p.name for p in Path(saved, "fsdp_model_0").iterdir())
        if rank == 0
        else [],
        "local": sum(_local(p).numel() for p in model.parameters()),
    }
    report["losses"] = _continue(accelerator, model, optimizer, first_step=2, steps=2)
    Path(folder, f"run_rank{rank}.json").write_text(json.dumps(report))

    original = fsdp_checkpoint.FSDPModelState.save

    def save_and_die(self: Any, target: Any) -> None:
        original(self, target)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    fsdp_checkpoint.FSDPModelState.save = save_and_die  # type: ignore[method-assign]
    accelerator.save_state()


def _continue(
    accelerator: Accelerator, model: Any, optimizer: Any, first_step: int, steps: int
) -> list[float]:
    rank, world = accelerator.process_index, accelerator.num_processes
    share = CKPT_SIZE // world
    losses = []
    for step in range(first_step, first_step + steps):
        tokens = global_batch(step, CKPT_SIZE)[rank * share : (rank + 1) * share]
        loss = lm_loss(model, tokens)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    return losses


def resume_job(folder: str) -> dict[str, Any]:
    """3 processes: load the newest complete checkpoint of the 2-process run, train 2 steps;
    then a FULL_STATE_DICT save and load round trip."""
    accelerator = _project(folder, fsdp_plugin=plugin(2))
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state()
    losses = _continue(accelerator, model, optimizer, first_step=2, steps=2)
    local = sum(_local(p).numel() for p in model.parameters())
    before = accelerator.get_state_dict(model)

    full_dir = f"{folder}/full"
    accelerator = _project(full_dir, fsdp_plugin=plugin(1, state_dict_type="FULL_STATE_DICT"))
    first = train(accelerator, 1, CKPT_SIZE)
    saved = accelerator.save_state()
    expected = accelerator.get_state_dict(first["model"])
    accelerator = _project(full_dir, fsdp_plugin=plugin(1, state_dict_type="FULL_STATE_DICT"))
    torch.manual_seed(1)
    second = TinyLM()  # other initial weights: the load must overwrite them
    second_optimizer = torch.optim.AdamW(second.parameters(), lr=1e-2)
    second, second_optimizer = accelerator.prepare(second, second_optimizer)
    accelerator.load_state(saved)
    got = accelerator.get_state_dict(second)
    stateless = stateless_optimizer_round_trip(f"{folder}/full_sgd")
    from pathlib import Path

    return {
        "losses": losses,
        "local": local,
        "total": sum(p.numel() for p in make_model().parameters()),
        "keys": sorted(before),
        "full_files": sorted(p.name for p in Path(saved, "fsdp_model_0").iterdir()),
        "full_round_trip": accelerator.is_main_process
        and sorted(got) == sorted(expected)
        and all(torch.equal(got[k], expected[k]) for k in expected),
        "stateless_round_trip": stateless,
    }


def stateless_optimizer_round_trip(folder: str) -> dict[str, Any]:
    """FSDP2 FULL_STATE_DICT with plain SGD (no per-parameter state): save, load into another.

    Returns whether the weights came back (rank 0 compares) and the learning rate after loading.
    """
    accelerator = _project(folder, fsdp_plugin=plugin(2, state_dict_type="FULL_STATE_DICT"))
    torch.manual_seed(2)
    model = TinyLM()
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
    saved = accelerator.save_state()
    expected = accelerator.get_state_dict(model)
    accelerator = _project(folder, fsdp_plugin=plugin(2, state_dict_type="FULL_STATE_DICT"))
    torch.manual_seed(3)
    other = TinyLM()
    other, other_optimizer = accelerator.prepare(other, torch.optim.SGD(other.parameters(), lr=0.5))
    accelerator.load_state(saved)
    got = accelerator.get_state_dict(other)
    return {
        "weights": not accelerator.is_main_process
        or all(torch.equal(got[key], expected[key]) for key in expected),
        "lr": other_optimizer.param_groups[0]["lr"],
    }


def plugin_fields_job(size: int, steps: int) -> dict[str, Any]:
    """FSDP2 with activation_checkpointing_offload, and param_init_fn on a meta-device model."""
    offloaded = train(
        fresh(
            fsdp_plugin=plugin(
                2, activation_checkpointing=True, activation_checkpointing_offload=True
            )
        ),
        steps,
        size,
    )
    wrappers = sorted(
        {type(m).__name__ for m in offloaded["model"].modules()}
        & {
            "OffloadWrapper",
            "CheckpointWrapper",
        }
    )
    initialized: list[str] = []

    def init(module: torch.nn.Module) -> None:
        initialized.append(type(module).__name__)
        module.to_empty(device="cpu", recurse=False)
        torch.manual_seed(len(initialized))
        for parameter in module.parameters(recurse=False):
            torch.nn.init.normal_(parameter, std=0.02)
        for buffer in module.buffers(recurse=False):
            buffer.zero_()

    with torch.device("meta"):
        meta_model = make_model()
    # device_placement=False: a meta model cannot be moved; param_init_fn gives it storage.
    meta_accelerator = fresh(fsdp_plugin=plugin(2, param_init_fn=init), device_placement=False)
    from_meta = train(meta_accelerator, steps, size, model=meta_model)
    local_sgd = local_sgd_under_fsdp(meta_accelerator, from_meta["model"])
    return {
        "offloaded": _strip(offloaded),
        "wrappers": wrappers,
        "initialized": len(initialized),
        "modules_with_tensors": sum(
            1
            for m in make_model().modules()
            if [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        ),
        "meta_left": any(p.is_meta for p in from_meta["model"].parameters()),
        "from_meta": _strip(from_meta),
        "local_sgd": local_sgd,
    }


def local_sgd_under_fsdp(accelerator: Accelerator, model: torch.nn.Module) -> dict[str, Any]:
    """LocalSGD under FSDP: refused when enabled (naming enabled=False), a no-op when disabled."""
    from accel.errors import UnsupportedFeatureError
    from accel.local_sgd import LocalSGD

    try:
        LocalSGD(accelerator, model, local_sgd_steps=2)
        refused = ""
    except UnsupportedFeatureError as error:
        refused = str(error)
    with LocalSGD(accelerator, model, local_sgd_steps=2, enabled=False) as local_sgd:
        local_sgd.step()
    return {"refused": refused, "disabled": not local_sgd.enabled, "steps": local_sgd.num_steps}
