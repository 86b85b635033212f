"""FSDP2 through the Accelerator vs the same loop by hand with ``fully_shard``, 2 gloo processes.

Part 1, training step: both variants shard the same transformer-style model per block and train
it on the same batches in the same processes, alternating hand (A) and Accelerator (B) rounds;
we report the median time per step and the ratio B/A (target <= 1.03).

Part 2, sharded checkpoints: ``Accelerator.save_state``/``load_state`` with SHARDED_STATE_DICT
vs hand-written ``torch.distributed.checkpoint`` save/load of the same model and AdamW state,
alternating; bandwidth = bytes of model and optimizer state per second; ratio accel/hand
(target >= 0.9).

Run: ``python benchmarks/bench_fsdp.py [--rounds 9] [--steps 10]``.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel_state.testing import spawn_workers

VOCAB, DIM, SEQ, BLOCKS, BATCH = 512, 256, 32, 4, 8


class Block(torch.nn.Module):
    """Pre-norm self-attention and MLP with residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block."""
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-1, -2) / DIM**0.5, dim=-1)
        x = x + self.proj(attention @ v)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Model(torch.nn.Module):
    """Embedding, blocks, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for every position."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model() -> Model:
    torch.manual_seed(0)
    return Model()


def batches(count: int, rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator) for _ in range(count)]


def loss_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def hand_setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def timed_steps(step: Any, data: list[torch.Tensor]) -> float:
    """Seconds per step over ``data`` (after a barrier, ended by one)."""
    dist.barrier()
    start = time.perf_counter()
    for tokens in data:
        step(tokens)
    dist.barrier()
    return (time.perf_counter() - start) / len(data)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Local bytes of parameters and optimizer tensors (the shards this rank writes)."""
    total = 0
    for parameter in model.parameters():
        local = getattr(parameter, "to_local", lambda p=parameter: p)()
        total += local.numel() * local.element_size()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                local = getattr(value, "to_local", lambda v=value: v)()
                total += local.numel() * local.element_size()
    return total


def worker(rounds: int, steps: int, folder: str) -> dict[str, Any]:
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    rank = accelerator.process_index
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    hand_model, hand_optimizer = hand_setup()
    data = batches(steps, rank)

    def accel_step(tokens: torch.Tensor) -> None:
        accelerator.backward(loss_of(model, tokens))
        optimizer.step()
        optimizer.zero_grad()

    def hand_step(tokens: torch.Tensor) -> None:
        loss_of(hand_model, tokens).backward()
        hand_optimizer.step()
        hand_optimizer.zero_grad()

    timed_steps(accel_step, data[:2])  # warm-up both
    timed_steps(hand_step, data[:2])
    step_times: dict[str, list[float]] = {"hand": [], "accel": []}
    for _ in range(rounds):
        step_times["hand"].append(timed_steps(hand_step, data))
        step_times["accel"].append(timed_steps(accel_step, data))

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    nbytes = state_bytes(hand_model, hand_optimizer)
    root = Path(folder)
    io_times: dict[str, list[float]] = {
        "hand save": [],
        "accel save": [],
        "hand load": [],
        "accel load": [],
    }

    def timed(label: str, action: Any) -> None:
        dist.barrier()
        start = time.perf_counter()
        action()
        dist.barrier()
        io_times[label].append(time.perf_counter() - start)

    def hand_save(target: Path) -> None:
        model_state, optim_state = get_state_dict(hand_model, hand_optimizer)
        save({"model": model_state, "optimizer": optim_state}, checkpoint_id=target)

    def hand_load(target: Path) -> None:
        model_state, optim_state = get_state_dict(hand_model, hand_optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        load(state, checkpoint_id=target)
        set_state_dict(
            hand_model,
            hand_optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    sharded = False
    for index in range(rounds):
        hand_dir, accel_dir = root / f"hand_{index}", root / f"accel_{index}"
        timed("hand save", functools.partial(hand_save, hand_dir))
        timed("accel save", functools.partial(accelerator.save_state, accel_dir))
        timed("hand load", functools.partial(hand_load, hand_dir))
        timed("accel load", functools.partial(accelerator.load_state, accel_dir))
        dist.barrier()
        sharded = (accel_dir / "fsdp_model_0" / ".metadata").exists()
        dist.barrier()
        if rank == 0:
            shutil.rmtree(hand_dir)
            shutil.rmtree(accel_dir)
    return {"steps": step_times, "io": io_times, "bytes": nbytes, "sharded": sharded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="accel-bench-fsdp-")
    try:
        results = spawn_workers(worker, 2, args=(args.rounds, args.steps, folder), timeout=1200)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"## FSDP2: Accelerator vs hand-written fully_shard, 2 gloo processes, {args.rounds} alternating rounds, medians"
    )
    print("| metric | hand | accel | accel / hand | target |")
    print("| --- | --- | --- | --- | --- |")
    hand = statistics.median(t for r in results for t in r["steps"]["hand"])
    accel = statistics.median(t for r in results for t in r["steps"]["accel"])
    print(
        f"| wall per step | {hand * 1e3:.2f} ms | {accel * 1e3:.2f} ms | {accel / hand:.3f} | <= 1.03 |"
    )
    total = sum(r["bytes"] for r in results)
    for kind in ("save", "load"):
        hand_s = statistics.median(results[0]["io"][f"hand {kind}"])
        accel_s = statistics.median(results[0]["io"][f"accel {kind}"])
        hand_bw, accel_bw = total / hand_s / 2**20, total / accel_s / 2**20
        print(
            f"| sharded {kind} ({total / 2**20:.0f} MiB) | {hand_bw:.0f} MiB/s | {accel_bw:.0f} MiB/s "
            f"| {accel_bw / hand_bw:.3f} | >= 0.9 |"
        )
    print(f"accel checkpoint held a sharded fsdp_model_0 folder: {results[0]['sharded']}")


if __name__ == "__main__":
    main()
