"""Accelerator under DeepSpeed vs the same loop by hand with ``deepspeed.initialize``, 2 gloo processes.

For ZeRO-2 and ZeRO-3: in the same two processes, one engine built by hand (raw, A: DistributedSampler,
``engine.backward``/``engine.step``) and one through ``Accelerator.prepare`` (B: the plain
Accelerate loop), same MLP, same config, epochs alternating A B A B; median wall and CPU time per
step and the ratio B / A. Target: ratio <= 1.03.

Run: ``python benchmarks/bench_deepspeed.py [--pairs 9] [--samples 2048]`` (needs ``accel[deepspeed]``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/accel-torch-extensions"))

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from accel import Accelerator, DeepSpeedPlugin
from accel_state import PartialState
from accel_state.testing import spawn_workers

FEATURES, HIDDEN, CLASSES, BATCH = 64, 256, 10, 32


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


def make_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(samples, FEATURES, generator=generator),
        torch.randint(0, CLASSES, (samples,), generator=generator),
    )


def timed_epoch(step: Any, loader: Any) -> tuple[float, float, int]:
    """Run one epoch; return (wall seconds, CPU seconds, steps)."""
    steps = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in loader:
        step(batch)
        steps += 1
    return time.perf_counter() - wall, time.process_time() - cpu, steps


def worker(stage: int, pairs: int, samples: int) -> dict[str, list[float]]:
    with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed's build and init messages
        return measure(stage, pairs, samples)


def measure(stage: int, pairs: int, samples: int) -> dict[str, list[float]]:
    """Time both loops in this process, alternating epochs."""
    import deepspeed

    PartialState()
    data = make_data(samples)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    model = make_model()
    ours, optimizer, loader = accelerator.prepare(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        DataLoader(
            data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
        ),
    )
    config = dict(accelerator.state.deepspeed_plugin.deepspeed_config)
    raw_model = make_model()
    engine, *_ = deepspeed.initialize(
        model=raw_model,
        optimizer=torch.optim.AdamW(raw_model.parameters(), lr=1e-3),
        config=config,
    )
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    raw_loader = DataLoader(data, batch_size=BATCH, sampler=sampler)

    def raw_step(batch: list[torch.Tensor]) -> None:
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(engine(inputs), targets)
        engine.backward(loss)
        engine.step()

    def accel_step(batch: list[torch.Tensor]) -> None:
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(ours(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    def raw(epoch: int) -> tuple[float, float, int]:
        sampler.set_epoch(epoch)
        return timed_epoch(raw_step, raw_loader)

    def accel(epoch: int) -> tuple[float, float, int]:
        return timed_epoch(accel_step, loader)

    variants = {"raw": raw, "accel": accel}
    timings: dict[str, list[float]] = {f"{n}_{k}": [] for n in variants for k in ("wall", "cpu")}
    for run in variants.values():  # warm-up
        run(0)
    for pair in range(pairs):
        for name, run in variants.items():
            dist.barrier()
            wall, cpu, steps = run(pair + 1)
            timings[f"{name}_wall"].append(wall / steps)
            timings[f"{name}_cpu"].append(cpu / steps)
    accelerator.end_training()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()
    print(
        f"## DeepSpeed: Accelerator vs hand-written deepspeed.initialize loop, 2 gloo processes, "
        f"{args.pairs} alternating rounds, medians"
    )
    print("| ZeRO stage | metric | by hand | accel | accel / by hand |")
    print("| --- | --- | --- | --- | --- |")
    for stage in (2, 3):
        rank0 = spawn_workers(worker, 2, args=(stage, args.pairs, args.samples), timeout=1800)[0]
        for kind in ("wall", "cpu"):
            raw = statistics.median(rank0[f"raw_{kind}"])
            ours = statistics.median(rank0[f"accel_{kind}"])
            print(
                f"| {stage} | {kind} per step | {raw * 1e3:.3f} ms | {ours * 1e3:.3f} ms "
                f"| {ours / raw:.3f} |"
            )


if __name__ == "__main__":
    main()
