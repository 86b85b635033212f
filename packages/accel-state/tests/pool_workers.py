"""Functions the worker-pool tests run on pooled processes (importable by module name)."""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist

from accel_state import PartialState


def identity_and_sum() -> dict:
    """This process's id, the job's variables, and an all-reduce over the job's group."""
    state = PartialState()
    total = torch.tensor([state.process_index + 1.0])
    dist.all_reduce(total)
    return {
        "pid": os.getpid(),
        "port": os.environ["MASTER_PORT"],
        "rank": state.process_index,
        "sum": total.item(),
        "marker": os.environ.get("POOL_TEST_MARKER"),
    }


def leave_a_mess(folder: str) -> int:
    """Change what a job may change in a process, and start a group of its own (not through accel)."""
    PartialState()
    os.environ["POOL_TEST_LEFTOVER"] = "1"
    os.chdir(folder)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_default_dtype(torch.float64)
    print(f"rank {dist.get_rank()} says hello")
    print(f"rank {dist.get_rank()} complains", file=sys.stderr)
    return os.getpid()


def what_the_last_job_left() -> dict:
    """What a new job finds in a process that ran :func:`leave_a_mess` before."""
    return {
        "pid": os.getpid(),
        "group_running": dist.is_initialized(),
        "leftover": os.environ.get("POOL_TEST_LEFTOVER"),
        "cwd": os.getcwd(),
        "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
        "dtype": str(torch.get_default_dtype()),
        "rank_now": PartialState().process_index,
    }


def fail_on_rank_one() -> int:
    """Rank 1 raises; rank 0 returns its process id."""
    if PartialState().process_index == 1:
        raise ValueError("rank one failed on purpose")
    return os.getpid()


def exit_on_rank_zero() -> None:
    """Rank 0's process exits in the middle of the job."""
    if int(os.environ["RANK"]) == 0:
        os._exit(3)
    PartialState().wait_for_everyone()
