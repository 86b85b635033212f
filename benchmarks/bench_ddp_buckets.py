"""DDP with accel's bucket hook (``SteadyBuckets``) vs DDP's built-in sum, same processes.

Both variants train the same MLP on the same batches in the same gloo processes, alternating
rounds of plain DDP (A) and DDP with the hook (B); we report the median wall time per step and
the ratio B / A. The hook makes a resume exact on any number of processes; this is its cost in
steps where it only sums (every step but a resumed run's first).

Run: ``python benchmarks/bench_ddp_buckets.py [--processes 3] [--pairs 9] [--steps 40]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_accelerator import BATCH, CLASSES, FEATURES, make_model  # the same MLP as that benchmark
from torch.nn.parallel import DistributedDataParallel

from accel.strategies.ddp.buckets import SteadyBuckets
from accel_state import PartialState
from accel_state.testing import spawn_workers


def _seconds_per_step(ddp: DistributedDataParallel, steps: int) -> float:
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    inputs, targets = torch.randn(BATCH, FEATURES), torch.randn(BATCH, CLASSES)
    for _ in range(3):  # warm-up, and DDP's bucket rebuild
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()
    torch.distributed.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()
    return (time.perf_counter() - started) / steps


def rounds(pairs: int, steps: int) -> dict[str, list[float]]:
    """One worker: ``pairs`` alternating rounds of plain DDP and DDP with the hook."""
    PartialState(cpu=True)
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {"plain": [], "hook": []}
    for _ in range(pairs):
        for variant in ("plain", "hook"):
            ddp = DistributedDataParallel(make_model())
            if variant == "hook":
                SteadyBuckets(ddp).register()
            times[variant].append(_seconds_per_step(ddp, steps))
    return times


def main() -> None:
    """Run the rounds and print the medians (rank 0's clock)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    times = spawn_workers(rounds, args.processes, args=(args.pairs, args.steps), timeout=1800)[0]
    plain, hook = (statistics.median(times[key]) * 1000 for key in ("plain", "hook"))
    print(
        f"## DDP's built-in sum vs accel's SteadyBuckets hook, {args.processes} gloo processes, "
        f"{args.pairs} alternating rounds of {args.steps} steps, medians"
    )
    print("| metric | DDP | DDP + SteadyBuckets | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| wall per step | {plain:.3f} ms | {hook:.3f} ms | {hook / plain:.3f} |")


if __name__ == "__main__":
    main()
