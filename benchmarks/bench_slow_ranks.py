"""The cost of the slow-rank report: a 10 ms training step with the report on and off, and raw DDP.

Two gloo processes train a small model on batches from a DataLoader, each step made about 10 ms
long (the forward pass plus a sleep standing for the rest of a real step). Three variants
alternate round by round (the order rotates): raw DDP by hand on a plain DataLoader, the
Accelerator with the slow-rank report off (``ACCEL_SLOW_RANK_INTERVAL=0``'s state) and on (the
defaults: every phase timed, data through the prepared loader, backward through DDP's bucket
hook, an exchange every 10 backward passes). Each round is 200 steps, so an "on" round holds 20
exchanges. Reported: rank 0's median seconds per step, the ratios on / off and on / raw, and
the median time of one exchange (starting the all-gather before a backward pass and waiting
for it after).

Goal: the report costs under 1 % of a 10 ms step.

Run: ``python benchmarks/bench_slow_ranks.py [--rounds 9] [--steps 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from accel_state.testing import spawn_workers

STEP_SECONDS = 0.010


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def measure(rounds: int, steps: int) -> dict[str, object]:
    """Seconds per step of each variant per round, and the exchange times (in every process)."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from accel import Accelerator

    accelerator = Accelerator()
    data = torch.randn(16 * steps * dist.get_world_size(), 64)
    model, optimizer, loader = accelerator.prepare(
        _model(), torch.optim.SGD(_model().parameters(), lr=0.01), DataLoader(data, batch_size=16)
    )
    hand_model = DistributedDataParallel(_model())
    hand_optimizer = torch.optim.SGD(hand_model.parameters(), lr=0.01)
    hand_loader = DataLoader(data[dist.get_rank() :: dist.get_world_size()], batch_size=16)
    monitor_owner = accelerator.fault_tolerance
    accelerator.backward(model(next(iter(loader))).sum())  # makes the monitor; warms up
    optimizer.step()
    optimizer.zero_grad()
    monitor = monitor_owner.slow_ranks
    assert monitor is not None and monitor.enabled, "the report must be on for this benchmark"
    exchanges: list[float] = []  # per window: starting the all-gather + waiting for it
    start_exchange, collect = monitor._exchange, monitor._collect

    def timed_exchange() -> None:
        start = time.perf_counter()
        start_exchange()
        exchanges.append(time.perf_counter() - start)

    def timed_collect() -> None:
        waiting = monitor._in_flight is not None
        start = time.perf_counter()
        collect()
        if waiting:
            exchanges[-1] += time.perf_counter() - start

    monitor._exchange = timed_exchange  # type: ignore[method-assign]
    monitor._collect = timed_collect  # type: ignore[method-assign]

    def accel_step(inputs: torch.Tensor) -> None:
        accelerator.backward(model(inputs).sum())
        optimizer.step()
        optimizer.zero_grad()

    def hand_step(inputs: torch.Tensor) -> None:
        hand_model(inputs).sum().backward()
        hand_optimizer.step()
        hand_optimizer.zero_grad()

    def run(variant: str) -> float:
        monitor.enabled = variant != "accel, report off"
        step = hand_step if variant == "raw DDP" else accel_step
        batches = hand_loader if variant == "raw DDP" else loader
        dist.barrier()
        start = time.perf_counter()
        for inputs in batches:
            step(inputs)
            time.sleep(STEP_SECONDS - 0.001)  # the rest of a 10 ms step
        dist.barrier()
        return (time.perf_counter() - start) / steps

    variants = ["raw DDP", "accel, report off", "accel, report on"]
    times: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(rounds):
        order = variants[index % 3 :] + variants[: index % 3]
        for name in order:
            times[name].append(run(name))
    return {"times": times, "exchanges": exchanges}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    result = spawn_workers(measure, 2, args=(args.rounds, args.steps), timeout=1800, reuse=False)[0]
    times: dict[str, list[float]] = result["times"]
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"## Slow-rank report, 2 gloo processes, a ~10 ms step, {args.rounds} rotating rounds "
        f"of {args.steps} steps, medians"
    )
    print("| variant | wall per step | / raw DDP |")
    print("| --- | --- | --- |")
    for name, value in medians.items():
        print(f"| {name} | {value * 1000:.3f} ms | {value / medians['raw DDP']:.4f} |")
    on, off = medians["accel, report on"], medians["accel, report off"]
    print(f"\nreport on / report off: {on / off:.4f} (goal: under 1.01)")
    exchanges = result["exchanges"]
    if exchanges:
        print(
            f"one exchange (every 10 backward passes): median {statistics.median(exchanges) * 1000:.3f} ms "
            f"over {len(exchanges)}, i.e. {statistics.median(exchanges) / 10 * 1000:.4f} ms per step"
        )


if __name__ == "__main__":
    main()
