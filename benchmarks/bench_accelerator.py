"""Accelerator training loop vs hand-written DDP + DistributedSampler, 2 gloo processes.

Both loops train the same MLP on the same data in the same processes, alternating raw (A) and
Accelerator (B) epochs; we report the median wall and CPU time per step and their ratio. When
Hugging Face Accelerate is installed, its Accelerator runs the same loop as a third alternating
variant (C). Then the import cost: ``python -c "from accel import Accelerator"`` vs
``python -c "import torch"``.

Run: ``python benchmarks/bench_accelerator.py [--pairs 7] [--samples 4096]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from accel import Accelerator
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


def timed_epoch(step: object, loader: object) -> tuple[float, float, int]:
    """Run one epoch; return (wall seconds, CPU seconds, steps)."""
    steps = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in loader:  # type: ignore[attr-defined]
        step(batch)  # type: ignore[operator]
        steps += 1
    return time.perf_counter() - wall, time.process_time() - cpu, steps


def raw_epoch(data: TensorDataset, epoch: int) -> tuple[float, float, int]:
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)

    def step(batch: list[torch.Tensor]) -> None:
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return timed_epoch(step, loader)


def accel_epoch(
    accelerator: Accelerator, data: TensorDataset, epoch: int
) -> tuple[float, float, int]:
    model = make_model()
    model, optimizer, loader = accelerator.prepare(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        DataLoader(
            data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(epoch)
        ),
    )

    def step(batch: list[torch.Tensor]) -> None:
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    result = timed_epoch(step, loader)
    accelerator.free_memory()
    return result


def accelerate_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


def worker(pairs: int, samples: int) -> dict[str, list[float]]:
    PartialState()
    accelerator = Accelerator()
    data = make_data(samples)
    variants = {
        "raw": lambda epoch: raw_epoch(data, epoch),
        "accel": lambda epoch: accel_epoch(accelerator, data, epoch),
    }
    if accelerate_available():
        import accelerate

        # Accelerate adopts the process group that accel started; same loop, its own prepare.
        theirs = accelerate.Accelerator(cpu=True)  # without cpu=True it runs as 2 single processes
        variants["accelerate"] = lambda epoch: accel_epoch(theirs, data, epoch)  # type: ignore[arg-type]
    timings: dict[str, list[float]] = {
        f"{name}_{kind}": [] for name in variants for kind in ("wall", "cpu")
    }
    for run in variants.values():  # warm-up every path
        run(0)
    for pair in range(pairs):
        for name, run in variants.items():
            dist.barrier()
            wall, cpu, steps = run(pair)
            timings[f"{name}_wall"].append(wall / steps)
            timings[f"{name}_cpu"].append(cpu / steps)
    return timings


def import_seconds(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()
    results = spawn_workers(worker, 2, args=(args.pairs, args.samples), timeout=900)
    rank0 = results[0]
    print(f"## Accelerator vs raw DDP, 2 gloo processes, {args.pairs} alternating rounds, medians")
    with_accelerate = "accelerate_wall" in rank0
    extra_head = " | Accelerate | Accelerate / raw" if with_accelerate else ""
    print(f"| metric | raw DDP | accel | accel / raw{extra_head} |")
    print("| --- | --- | --- | ---" + (" | --- | ---" if with_accelerate else "") + " |")
    for kind in ("wall", "cpu"):
        raw = statistics.median(rank0[f"raw_{kind}"])
        ours = statistics.median(rank0[f"accel_{kind}"])
        row = f"| {kind} per step | {raw * 1e3:.3f} ms | {ours * 1e3:.3f} ms | {ours / raw:.3f}"
        if with_accelerate:
            theirs = statistics.median(rank0[f"accelerate_{kind}"])
            row += f" | {theirs * 1e3:.3f} ms | {theirs / raw:.3f}"
        print(row + " |")
    if not with_accelerate:
        print('\n(Accelerate is not installed here; `nox -s "bench(accelerate=True)"` adds it.)')
    torch_times, accel_times, lazy_times = [], [], []
    for _ in range(5):
        torch_times.append(import_seconds("import torch"))
        accel_times.append(import_seconds("from accel import Accelerator"))
        lazy_times.append(import_seconds("import accel"))
    base = statistics.median(torch_times)
    print("\n## Import time, 5 alternating runs, medians")
    print("| statement | seconds | minus `import torch` |")
    print("| --- | --- | --- |")
    print(f"| `import torch` | {base:.3f} | 0 |")
    print(
        f"| `import accel` | {statistics.median(lazy_times):.3f} | {statistics.median(lazy_times) - base:+.3f} |"
    )
    full = statistics.median(accel_times)
    print(f"| `from accel import Accelerator` | {full:.3f} | {full - base:+.3f} |")


if __name__ == "__main__":
    main()
