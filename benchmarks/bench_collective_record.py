"""The cost of accel-ops' collective records: a bare torch.distributed call vs the same call recorded.

Every accel-ops collective notes its name, sequence number, operand and the caller's line in a
small ring (``accel_ops.records``), so that a hang can say where each rank waits. This measures
what that adds to one collective: two gloo processes run ``dist.all_reduce`` bare (A) and
wrapped by ``accel_ops.records.recorded`` (B), alternating A B, B A, ... on the same tensor, and
report rank 0's median wall time per call, the ratio B / A of the medians, the median of the
per-pair ratios (each B against the A run next to it) and the difference of the medians in wall
and in the calling thread's CPU time (which scheduling noise disturbs far less). A third
line times the record alone, with no communication (a recorded no-op vs a plain one, best of 5
rounds of 200,000 calls).

Targets: ratio <= 1.02 at 1 MB; at 64 bytes the absolute cost per call is reported. Rounds:
``--pairs`` at 64 bytes, half as many at 1 MB.

Run: ``python benchmarks/bench_collective_record.py [--pairs 2000]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from accel_ops.records import recorded, reset_records
from accel_state.testing import spawn_workers

MB = 1 << 20


def bare(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)


@recorded("all_reduce")
def with_record(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)


def timed_call(
    function: Callable[[torch.Tensor], None], tensor: torch.Tensor
) -> tuple[float, float]:
    """Wall and this thread's CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.thread_time()
    function(tensor)
    return time.perf_counter() - wall, time.thread_time() - cpu


def record_alone() -> float:
    """Microseconds a record adds to a call that does nothing else (best of 5 rounds)."""

    def plain(tensor: torch.Tensor) -> None:
        return None

    wrapped = recorded("noop")(plain)
    tensor = torch.ones(16)
    calls = 200_000
    best = []
    for function in (plain, wrapped):
        rounds = timeit.repeat(lambda f=function: f(tensor), number=calls, repeat=5)
        best.append(min(rounds) / calls)
    return (best[1] - best[0]) * 1e6


def worker(pairs: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    results = []
    for label, numel, count in (("64 B", 16, pairs), ("1 MB", MB // 4, pairs // 2)):
        tensor = torch.ones(numel)
        for _ in range(10):  # warm-up
            bare(tensor)
            with_record(tensor)
        dist.barrier()
        times: dict[str, list[tuple[float, float]]] = {"bare": [], "recorded": []}
        for index in range(count):
            order = (("bare", bare), ("recorded", with_record))
            for name, function in order if index % 2 == 0 else order[::-1]:
                times[name].append(timed_call(function, tensor))
        reset_records()
        paired = [
            ours[0] / theirs[0]
            for ours, theirs in zip(times["recorded"], times["bare"], strict=True)
        ]
        results.append(
            {
                "label": label,
                "count": count,
                "paired": statistics.median(paired),
                **{
                    name: (
                        statistics.median(wall for wall, _ in samples),
                        statistics.median(cpu for _, cpu in samples),
                    )
                    for name, samples in times.items()
                },
            }
        )
    dist.destroy_process_group()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="A/B call pairs at 64 bytes")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = spawn_workers(worker, 2, args=(args.pairs,), timeout=600)[0]
    alone = record_alone()
    print(
        "dist.all_reduce bare (A) vs recorded by accel_ops.records (B): gloo, 2 processes, rank 0, "
        f"medians of alternating A/B calls; {time.perf_counter() - started:.0f} s"
    )
    header = (
        f"{'tensor':<8}{'pairs':>7}{'bare us':>10}{'recorded us':>13}{'ratio':>7}"
        f"{'paired':>8}{'overhead us':>13}{'CPU overhead us':>17}  target"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        (bare_wall, bare_cpu), (ours_wall, ours_cpu) = row["bare"], row["recorded"]
        ratio = ours_wall / bare_wall
        if row["label"] == "1 MB":
            verdict = f"ratio <= 1.02: {'ok' if ratio <= 1.02 else 'MISSED'}"
        else:
            verdict = "reported"
        print(
            f"{row['label']:<8}{row['count']:>7}{bare_wall * 1e6:>10.1f}{ours_wall * 1e6:>13.1f}"
            f"{ratio:>7.3f}{row['paired']:>8.3f}{(ours_wall - bare_wall) * 1e6:>13.1f}"
            f"{(ours_cpu - bare_cpu) * 1e6:>17.1f}  {verdict}"
        )
    print(f"the record alone (no communication): {alone:.2f} us per call")


if __name__ == "__main__":
    main()
