"""accel_ops.gather / reduce on nested structures vs the same hand-written torch.distributed calls.

Two gloo processes run both versions on the same data in the same run, alternating raw (A) and
accel_ops (B) calls (A B, B A, A B...); we report rank 0's median wall time per call, the ratio
B / A, the overhead per call (difference of the medians) and the same difference in the calling
thread's CPU time, which the machine's scheduling noise disturbs far less.

Targets: <= 50 us per call of overhead on small tensors, ratio <= 1.05 at >= 1 MB.

Run: ``python benchmarks/bench_ops.py [--pairs 1500]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import accel_ops
from accel_state.testing import spawn_workers

MB = 1 << 20
Case = tuple[str, Any, Callable[[Any], Any], Callable[[Any], Any], bool]


def raw_gather_one(tensor: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts)


def raw_mean_one(tensor: torch.Tensor) -> torch.Tensor:
    result = tensor.clone()
    dist.all_reduce(result)
    result /= dist.get_world_size()
    return result


def raw_gather_nested(data: dict[str, Any]) -> dict[str, Any]:
    return {"x": raw_gather_one(data["x"]), "y": [raw_gather_one(t) for t in data["y"]]}


def raw_mean_nested(data: dict[str, Any]) -> dict[str, Any]:
    return {"x": raw_mean_one(data["x"]), "y": [raw_mean_one(t) for t in data["y"]]}


def nested(first_bytes: int, second_bytes: int) -> dict[str, Any]:
    return {"x": torch.randn(first_bytes // 4), "y": [torch.randn(second_bytes // 4)]}


def small_nested() -> dict[str, Any]:
    return {"x": torch.randn(16), "y": [torch.randn(16), torch.randn(4, 4)]}


def cases() -> list[Case]:
    """(label, data, raw function, accel_ops function, large)."""
    return [
        ("gather 1 tensor, 64 B", torch.randn(16), raw_gather_one, accel_ops.gather, False),
        ("gather nested 3 x 64 B", small_nested(), raw_gather_nested, accel_ops.gather, False),
        (
            "gather nested 1 MB + 4 MB",
            nested(MB, 4 * MB),
            raw_gather_nested,
            accel_ops.gather,
            True,
        ),
        ("reduce 1 tensor, 64 B", torch.randn(16), raw_mean_one, accel_ops.reduce, False),
        ("reduce nested 3 x 64 B", small_nested(), raw_mean_nested, accel_ops.reduce, False),
        (
            "reduce nested 1 MB + 4 MB",
            nested(MB, 4 * MB),
            raw_mean_nested,
            accel_ops.reduce,
            True,
        ),
    ]


def flat(data: Any) -> torch.Tensor:
    """Every tensor of a tensor / dict / list structure, flattened into one."""
    if isinstance(data, torch.Tensor):
        return data.flatten()
    values = data.values() if isinstance(data, dict) else data
    return torch.cat([flat(value) for value in values])


def timed_call(function: Callable[[Any], Any], data: Any) -> tuple[float, float]:
    """Wall and this thread's CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.thread_time()
    function(data)
    return time.perf_counter() - wall, time.thread_time() - cpu


def worker(pairs: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(dist.get_rank())
    results = []
    for label, data, raw, ours, large in cases():
        if not torch.equal(flat(raw(data)), flat(ours(data))):
            raise AssertionError(f"{label}: accel_ops and the raw calls disagree")
        for _ in range(5):  # warm-up
            raw(data)
            ours(data)
        dist.barrier()
        times: dict[str, list[tuple[float, float]]] = {"raw": [], "ours": []}
        for index in range(pairs // 10 if large else pairs):
            order = (
                (("raw", raw), ("ours", ours)) if index % 2 == 0 else (("ours", ours), ("raw", raw))
            )
            for name, function in order:
                times[name].append(timed_call(function, data))
        medians = {
            name: (
                statistics.median(wall for wall, _ in samples),
                statistics.median(cpu for _, cpu in samples),
            )
            for name, samples in times.items()
        }
        results.append({"label": label, "large": large, **medians})
    dist.destroy_process_group()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1500, help="A/B call pairs per small case")
    args = parser.parse_args()
    started = time.perf_counter()
    results = spawn_workers(worker, 2, args=(args.pairs,), timeout=300)[0]
    print(
        "accel_ops vs hand-written torch.distributed: gloo, 2 processes, rank 0, medians of "
        f"{args.pairs} alternating A/B calls ({args.pairs // 10} for >= 1 MB); "
        f"{time.perf_counter() - started:.0f} s"
    )
    header = (
        f"{'case':<27}{'raw us':>10}{'accel_ops us':>14}{'ratio':>7}"
        f"{'overhead us':>13}{'CPU overhead us':>17}  target"
    )
    print(header)
    print("-" * len(header))
    for row in results:
        (raw_wall, raw_cpu), (our_wall, our_cpu) = row["raw"], row["ours"]
        ratio = our_wall / raw_wall
        overhead = (our_wall - raw_wall) * 1e6
        if row["large"]:
            verdict = f"ratio <= 1.05: {'ok' if ratio <= 1.05 else 'MISSED'}"
        else:
            verdict = f"<= 50 us: {'ok' if overhead <= 50 else 'MISSED'}"
        print(
            f"{row['label']:<27}{raw_wall * 1e6:>10.1f}{our_wall * 1e6:>14.1f}{ratio:>7.3f}"
            f"{overhead:>13.1f}{(our_cpu - raw_cpu) * 1e6:>17.1f}  {verdict}"
        )


if __name__ == "__main__":
    main()
