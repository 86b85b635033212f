"""FSDP2 through the Accelerator vs the same loop by hand with ``fully_shard``, 2 gloo processes.

Part 1, training step: both variants shard the same transformer-style model per block and train
it on the same batches in the same processes, alternating hand (A) and Accelerator (B) rounds
(A B, then B A); we report the median time per step and the median of the per-round ratios B/A
(target <= 1.03).

Part 2, sharded checkpoints: ``Accelerator.save_state``/``load_state`` with SHARDED_STATE_DICT
vs hand-written ``torch.distributed.checkpoint`` save/load of the same model and AdamW state,
alternating in the same way; bandwidth = bytes of model and optimizer state per second; ratio
accel/hand = median of the per-round ratios (target >= 0.9). Two state sizes: at 39 MiB a save
is dominated by fixed costs (accel adds RNG state files, a manifest, an atomic publish and a
status exchange per protocol step), at 589 MiB by writing the bytes.

On a disk, fsync stalls make single saves vary by 3x; ``--folder /dev/shm`` measures the
software path alone.

Run: ``python benchmarks/bench_fsdp.py [--rounds 9] [--steps 10] [--checkpoint-dims 256 1024]
[--folder DIR]``.
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
from paired_steps import alternating_step_times

from accel import Accelerator, FullyShardedDataParallelPlugin
from accel_state.testing import spawn_workers

VOCAB, DIM, SEQ, BLOCKS, BATCH = 512, 256, 32, 4, 8


class Block(torch.nn.Module):
    """Pre-norm self-attention and MLP with residuals."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block."""
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-1, -2) / x.shape[-1] ** 0.5, dim=-1)
        x = x + self.proj(attention @ v)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Model(torch.nn.Module):
    """Embedding, blocks, head."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.blocks = torch.nn.ModuleList([Block(dim) for _ in range(BLOCKS)])
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for every position."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(dim: int) -> Model:
    torch.manual_seed(0)
    return Model(dim)


def batches(count: int, rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator) for _ in range(count)]


def loss_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def hand_setup(dim: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    model = make_model(dim)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


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


def accel_prepared(dim: int) -> tuple[Accelerator, torch.nn.Module, Any]:
    """The model sharded by an FSDP Accelerator (one unit per ``Block``), with AdamW."""
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = make_model(dim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def prepared(dim: int) -> tuple[Accelerator, torch.nn.Module, Any, torch.nn.Module, Any]:
    """An Accelerator-prepared model and a hand-sharded twin, each with an AdamW optimizer."""
    accelerator, model, optimizer = accel_prepared(dim)
    hand_model, hand_optimizer = hand_setup(dim)
    return accelerator, model, optimizer, hand_model, hand_optimizer


def step_worker(rounds: int, steps: int) -> dict[str, list[float]]:
    """Part 1: seconds per training step, by hand and through the Accelerator."""
    accelerator, model, optimizer, hand_model, hand_optimizer = prepared(DIM)
    data = batches(steps, accelerator.process_index)

    step_times = alternating_step_times(
        accelerator, (model, optimizer), (hand_model, hand_optimizer), loss_of, data, rounds
    )
    return step_times


def checkpoint_worker(rounds: int, dim: int, folder: str) -> dict[str, Any]:
    """Part 2: seconds per sharded save and load of a ``dim``-wide model and its AdamW state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    accelerator, model, optimizer, hand_model, hand_optimizer = prepared(dim)
    tokens = batches(1, accelerator.process_index)[0]
    accelerator.backward(loss_of(model, tokens))  # one step each: AdamW state exists
    optimizer.step()
    loss_of(hand_model, tokens).backward()
    hand_optimizer.step()
    rank = accelerator.process_index
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
        saves = [
            ("hand save", functools.partial(hand_save, hand_dir)),
            ("accel save", functools.partial(accelerator.save_state, accel_dir)),
        ]
        loads = [
            ("hand load", functools.partial(hand_load, hand_dir)),
            ("accel load", functools.partial(accelerator.load_state, accel_dir)),
        ]
        for label, action in [*saves, *loads] if index % 2 == 0 else [*saves[::-1], *loads[::-1]]:
            timed(label, action)
        dist.barrier()
        sharded = (accel_dir / "fsdp_model_0" / ".metadata").exists()
        dist.barrier()
        if rank == 0:
            shutil.rmtree(hand_dir)
            shutil.rmtree(accel_dir)
    return {"io": io_times, "bytes": nbytes, "sharded": sharded}


def paired_ratio(hand: list[float], accel: list[float]) -> float:
    """Median over rounds of accel / hand times measured next to each other in one round.

    A stall (fsync, scheduler) lengthens single runs up to 3x on a 2-core machine; pairing
    each run with its neighbour keeps one stall from moving the whole comparison.
    """
    return statistics.median(a / h for h, a in zip(hand, accel, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--checkpoint-dims",
        type=int,
        nargs="+",
        default=[DIM, 4 * DIM],
        help="model widths for part 2 (the default pair: 39 MiB and 589 MiB of state)",
    )
    parser.add_argument(
        "--folder",
        default=None,
        help="where part 2 writes (default: the temp dir; /dev/shm takes the disk out)",
    )
    args = parser.parse_args()
    steps = spawn_workers(step_worker, 2, args=(args.rounds, args.steps), timeout=1200)
    print(
        f"## FSDP2: Accelerator vs hand-written fully_shard, 2 gloo processes, {args.rounds} "
        "alternating rounds, medians"
    )
    print("| metric | hand | accel | accel / hand | target |")
    print("| --- | --- | --- | --- | --- |")
    hand = statistics.median(t for r in steps for t in r["hand"])
    accel = statistics.median(t for r in steps for t in r["accel"])
    ratio = paired_ratio(steps[0]["hand"], steps[0]["accel"])
    print(f"| wall per step | {hand * 1e3:.2f} ms | {accel * 1e3:.2f} ms | {ratio:.3f} | <= 1.03 |")
    for dim in args.checkpoint_dims:
        folder = tempfile.mkdtemp(prefix="accel-bench-fsdp-", dir=args.folder)
        try:
            results = spawn_workers(
                checkpoint_worker, 2, args=(args.rounds, dim, folder), timeout=1200
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        total = sum(r["bytes"] for r in results)
        for kind in ("save", "load"):
            hand_times = results[0]["io"][f"hand {kind}"]
            accel_times = results[0]["io"][f"accel {kind}"]
            hand_s, accel_s = statistics.median(hand_times), statistics.median(accel_times)
            hand_bw, accel_bw = total / hand_s / 2**20, total / accel_s / 2**20
            ratio = 1 / paired_ratio(hand_times, accel_times)  # bandwidth: the inverse of time
            print(
                f"| sharded {kind}, d={dim} ({total / 2**20:.0f} MiB) | {hand_bw:.0f} MiB/s "
                f"({hand_s * 1e3:.0f} ms) | {accel_bw:.0f} MiB/s ({accel_s * 1e3:.0f} ms) "
                f"| {ratio:.3f} | >= 0.9 |"
            )
        print(
            f"d={dim}: accel checkpoint held a sharded fsdp_model_0 folder: {results[0]['sharded']}"
        )


if __name__ == "__main__":
    main()
