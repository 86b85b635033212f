"""Notebook workers that wait for a peer who has already left end at once instead of hanging.

A gloo process group connects every rank when it is created, so a worker that starts one (a
``PartialState``/``Accelerator`` made inside the launched function) waits for all its peers. A
peer that has already returned or raised without starting it never arrives, and the waiting
worker would sit in the rendezvous until the group timeout (30 minutes by default), so the
notebook hangs; with ``max_restarts`` it is the restarted round that hangs. Each forked worker
runs the function through :func:`notebook_worker`: on leaving without a process group it leaves
a mark in a folder the launch shares, and a watchdog thread ends a worker (exit code 1, with the
reason on stderr) that is waiting in the rendezvous while a peer of the same round has left.
"""

from __future__ import annotations

import functools
import os
import pathlib
import sys
import threading
from collections.abc import Callable
from typing import Any

POLL_SECONDS = 0.05
_EXIT_CODE = 1


def _round() -> str:
    """The restart round of this worker (torch elastic counts restarts from 0)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def notebook_worker(function: Callable[..., Any], departures: pathlib.Path) -> Callable[..., Any]:
    """``function`` wrapped for a forked worker: watched, and marking a departure without a group.

    Args:
        function: The function ``notebook_launcher`` was given (its name stays, for torch
            elastic's logs and failure reports).
        departures: A folder shared by the workers of this launch (they are forked).
    """

    @functools.wraps(function)
    def run(*args: Any) -> Any:
        rank = os.environ.get("RANK", "0")
        stop = threading.Event()
        watchdog = threading.Thread(
            target=_watch, args=(departures, _round(), rank, stop), daemon=True
        )
        watchdog.start()
        try:
            return function(*args)
        finally:
            stop.set()
            if not _in_process_group():
                (departures / f"{_round()}-{rank}").touch()

    return run


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _left_peers(departures: pathlib.Path, round_: str, rank: str) -> list[str]:
    prefix = f"{round_}-"
    return sorted(
        path.name.removeprefix(prefix)
        for path in departures.glob(f"{prefix}*")
        if path.name != f"{prefix}{rank}"
    )


def _watch(departures: pathlib.Path, round_: str, rank: str, stop: threading.Event) -> None:
    """End this worker when it waits in the group rendezvous for a peer that has left."""
    from accel_state.process_group import group_start_in_progress

    while not stop.wait(POLL_SECONDS):
        if not group_start_in_progress():
            continue
        left = _left_peers(departures, round_, rank)
        if left:
            sys.stderr.write(
                f"notebook_launcher: rank {rank} is starting the process group, but rank(s) "
                f"{', '.join(left)} already left the function without starting it, so the group "
                "can never form. Create the PartialState / Accelerator on every process (or on "
                "none), at the start of the function.\n"
            )
            sys.stderr.flush()
            os._exit(_EXIT_CODE)
