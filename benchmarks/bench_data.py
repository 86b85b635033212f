"""Iterating a prepared dataloader vs a raw DataLoader with DistributedSampler (2 gloo processes).

Both sides load the same shuffled data, batch 32 per process, and move each batch to the device.
Epochs alternate A B A B...; each process reports the median time per batch of each side, and
the ratio prepared / raw (target <= 1.03: the wrapper adds no copy or collective per batch).

Run: python benchmarks/bench_data.py [--samples N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from accel_data import prepare_data_loader, set_seed
from accel_state import PartialState
from accel_state.testing import spawn_workers

BATCH_SIZE = 32


def make_dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(samples, 64, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return TensorDataset(features, labels)


def epoch_raw(
    loader: DataLoader, sampler: DistributedSampler, epoch: int, device: torch.device
) -> tuple[float, int]:
    sampler.set_epoch(epoch)
    start = time.perf_counter()
    count = 0
    for features, labels in loader:
        features, labels = features.to(device), labels.to(device)
        count += 1
    return time.perf_counter() - start, count


def epoch_prepared(loader: DataLoader) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    for _features, _labels in loader:
        count += 1
    return time.perf_counter() - start, count


def run(samples: int, rounds: int) -> dict[str, float]:
    state = PartialState()
    set_seed(0)
    dataset = make_dataset(samples)
    sampler = DistributedSampler(dataset, state.num_processes, state.process_index, seed=0)
    raw = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
    prepared = prepare_data_loader(
        DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True), put_on_device=True
    )
    epoch_raw(raw, sampler, 0, state.device)  # warm-up both sides
    epoch_prepared(prepared)
    raw_times, prepared_times = [], []
    for epoch in range(rounds):
        state.wait_for_everyone()
        seconds, count = epoch_raw(raw, sampler, epoch + 1, state.device)
        raw_times.append(seconds / count)
        state.wait_for_everyone()
        seconds, count = epoch_prepared(prepared)
        prepared_times.append(seconds / count)
    return {
        "raw": statistics.median(raw_times),
        "prepared": statistics.median(prepared_times),
        "batches": count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=21)
    options = parser.parse_args()
    started = time.perf_counter()
    results = spawn_workers(run, 2, args=(options.samples, options.rounds), timeout=300)
    print(
        f"accel-data vs raw DataLoader + DistributedSampler, 2 gloo processes, batch {BATCH_SIZE}"
    )
    print(
        f"{results[0]['batches']} batches per process per epoch, {options.rounds} alternating epochs each"
    )
    for rank, result in enumerate(results):
        ratio = result["prepared"] / result["raw"]
        print(
            f"rank {rank}: raw {result['raw'] * 1e6:8.1f} us/batch   "
            f"prepared {result['prepared'] * 1e6:8.1f} us/batch   ratio {ratio:.3f}"
        )
    overall = statistics.median(r["prepared"] / r["raw"] for r in results)
    print(f"ratio (median over processes): {overall:.3f} (target <= 1.03)")
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
