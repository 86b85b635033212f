"""Training steps by hand vs through the Accelerator, timed in alternating rounds (A B, then B A).

Shared by the benchmarks that compare a hand-written distributed loop with the same loop through
the Accelerator (``bench_fsdp.py``, ``bench_nd.py``); run inside every process of the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Loss = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


def timed_steps(step: Callable[[torch.Tensor], None], data: list[torch.Tensor]) -> float:
    """Seconds per step over ``data`` (after a barrier, ended by one)."""
    dist.barrier()
    start = time.perf_counter()
    for tokens in data:
        step(tokens)
    dist.barrier()
    return (time.perf_counter() - start) / len(data)


def alternating_step_times(
    accelerator: Any,
    prepared: tuple[torch.nn.Module, torch.optim.Optimizer],
    by_hand: tuple[torch.nn.Module, torch.optim.Optimizer],
    loss_of: Loss,
    data: list[torch.Tensor],
    rounds: int,
) -> dict[str, list[float]]:
    """Seconds per step of each variant, one value per round ("hand" and "accel").

    Both variants warm up on two batches first; then each round runs both over ``data``, the
    hand-written loop first in even rounds and second in odd ones.
    """
    model, optimizer = prepared
    hand_model, hand_optimizer = by_hand

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
    times: dict[str, list[float]] = {"hand": [], "accel": []}
    for index in range(rounds):  # A B, then B A: neither variant always runs first
        variants = [("hand", hand_step), ("accel", accel_step)]
        for label, step in variants if index % 2 == 0 else variants[::-1]:
            times[label].append(timed_steps(step, data))
    return times
