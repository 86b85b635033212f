"""The script ``accel test`` launches: ranks, a barrier, an all-reduce, main_process_first order.

Run it through a launcher (``accel launch -m accel_launch.sanity_check``); every process prints its
result and the main process prints the verdict. The exit code is 0 only when every check passed on
every process. Depends on accel-state and torch only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from accel_state.partial_state import PartialState
from accel_state.shared import reset_state

Check = Callable[[PartialState, argparse.Namespace], str]


def check_ranks(state: PartialState, args: argparse.Namespace) -> str:
    """Every process has a distinct rank in ``[0, num_processes)``."""
    n = state.num_processes
    if not 0 <= state.process_index < n:
        raise AssertionError(f"rank {state.process_index} outside [0, {n})")
    if state.use_distributed:
        mine = torch.tensor([state.process_index], device=state.device)
        gathered = [torch.zeros_like(mine) for _ in range(n)]
        dist.all_gather(gathered, mine)
        ranks = [int(tensor.item()) for tensor in gathered]
        if sorted(ranks) != list(range(n)):
            raise AssertionError(f"ranks are {ranks}, expected each of 0..{n - 1} once")
    return f"rank {state.process_index} of {n} (local {state.local_process_index})"


def check_barrier(state: PartialState, args: argparse.Namespace) -> str:
    """``wait_for_everyone`` returns on every process."""
    state.wait_for_everyone()
    return "barrier passed"


def check_all_reduce(state: PartialState, args: argparse.Namespace) -> str:
    """Summing the ranks gives n(n-1)/2 everywhere."""
    value = torch.tensor([float(state.process_index), 1.0], device=state.device)
    if state.use_distributed:
        dist.all_reduce(value)
    n = state.num_processes
    expected = [n * (n - 1) / 2, float(n)]
    if value.tolist() != expected:
        raise AssertionError(f"all_reduce gave {value.tolist()}, expected {expected}")
    return f"all_reduce sum {value[0].item():.0f} ok"


def check_main_process_first(state: PartialState, args: argparse.Namespace) -> str:
    """The main process finishes its ``main_process_first`` block before any other starts."""
    if args.workdir is None or state.num_nodes > 1:
        with state.main_process_first():
            pass
        return "main_process_first ran (ordering not checked across machines)"
    marker = Path(args.workdir) / "main_process_done"
    with state.main_process_first():
        if state.is_main_process:
            time.sleep(0.2)
            marker.write_text(str(os.getpid()))
        elif not marker.exists():
            raise AssertionError("entered main_process_first before the main process finished")
    return "main_process_first ordering ok"


CHECKS: list[tuple[str, Check]] = [
    ("ranks", check_ranks),
    ("barrier", check_barrier),
    ("all_reduce", check_all_reduce),
    ("main_process_first", check_main_process_first),
]


def main(argv: list[str] | None = None) -> int:
    """Run every check, agree on the verdict across processes, print it; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default=None, help="Shared folder for the ordering check.")
    args = parser.parse_args(argv)
    state = PartialState()
    failures = 0
    for name, check in CHECKS:
        try:
            detail = check(state, args)
            print(f"[rank {state.process_index}] {name}: {detail}", flush=True)
        except AssertionError as error:
            failures += 1
            print(
                f"[rank {state.process_index}] {name}: FAILED: {error}", file=sys.stderr, flush=True
            )
    total = torch.tensor([float(failures)], device=state.device)
    if state.use_distributed:
        dist.all_reduce(total)
    ok = total.item() == 0
    state.print(
        f"accel sanity check: {'all checks passed' if ok else f'{total.item():.0f} check(s) FAILED'} "
        f"on {state.num_processes} process(es), {state.distributed_type.value} on {state.device}"
    )
    reset_state()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
