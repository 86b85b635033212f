"""Run a function on N real processes joined in a gloo process group, with a hard deadline."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from accel_state.envvars import patch_environment
from accel_state.errors import AccelStateError
from accel_state.testing.ports import find_free_port


class WorkerFailedError(AccelStateError, RuntimeError):
    """A worker raised; the message holds its rank and traceback."""


class WorkersTimedOutError(AccelStateError, TimeoutError):
    """Workers did not all finish before the deadline; they were killed."""


def _worker_main(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    rank: int,
    environ: dict[str, str],
    results: Any,
) -> None:
    os.environ.update(environ)
    try:
        value = function(*args)
        payload = ("ok", pickle.dumps(value))
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        payload = ("error", traceback.format_exc().encode())
    finally:
        from accel_state.shared import reset_state

        with contextlib.suppress(Exception):  # teardown problems must not hide the result
            reset_state()
    results.put((rank, payload[0], payload[1]))


def spawn_workers(
    function: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run ``function(*args)`` on ``world_size`` fresh processes set up like ``torchrun`` does.

    Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT`` and ``OMP_NUM_THREADS=1`` (plus ``env``), so
    ``PartialState()`` inside it joins one gloo group. ``function`` must be importable
    (module level) because processes are spawned.

    Returns:
        The return values, indexed by rank.

    Raises:
        WorkerFailedError: A worker raised; the others are killed at once.
        WorkersTimedOutError: Not all workers finished within ``timeout`` seconds.

    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = find_free_port()
    processes = []
    for rank in range(world_size):
        environ = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            **(dict(env) if env else {}),
        }
        process = context.Process(
            target=_worker_main, args=(function, args, rank, environ, results), daemon=False
        )
        # The child inherits the environment at start, before it imports anything (torch reads
        # OMP_NUM_THREADS when it is imported, which happens before _worker_main runs).
        with patch_environment(**environ):
            process.start()
        processes.append(process)
    deadline = time.monotonic() + timeout
    values: dict[int, Any] = {}
    succeeded = False
    try:
        while len(values) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(values))
                raise WorkersTimedOutError(
                    f"Ranks {missing} of {world_size} did not finish within {timeout:.0f} s; killed."
                )
            try:
                rank, status, payload = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [
                    rank
                    for rank, process in enumerate(processes)
                    if process.exitcode not in (None, 0) and rank not in values
                ]
                if dead:
                    raise WorkerFailedError(
                        f"Rank {dead[0]} exited with code {processes[dead[0]].exitcode} "
                        "without reporting a result."
                    ) from None
                continue
            if status == "error":
                raise WorkerFailedError(f"Rank {rank} of {world_size} failed:\n{payload.decode()}")
            values[rank] = pickle.loads(payload)
        succeeded = True
    finally:
        for process in processes:
            if succeeded:
                process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        results.close()
    return [values[rank] for rank in range(world_size)]
