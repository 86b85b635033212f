"""Run a function on N real processes joined in a gloo process group, with a hard deadline."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from accel_state.envvars import patch_environment
from accel_state.testing.pool import SHARED_POOLS, pool_environment
from accel_state.testing.ports import find_free_port
from accel_state.testing.reports import (
    FAILURE_GRACE_SECONDS,
    ReportCollector,
    WorkerFailedError,
    WorkersTimedOutError,
    collect_reports,
    run_for_report,
)

__all__ = [
    "FAILURE_GRACE_SECONDS",
    "WorkerFailedError",
    "WorkersTimedOutError",
    "spawn_workers",
    "worker_environment",
]


def _worker_main(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    rank: int,
    environ: dict[str, str],
    results: Any,
) -> None:
    os.environ.update(environ)
    results.put((rank, *run_for_report(function, args)))  # before the teardown below
    from accel_state.shared import reset_state

    with contextlib.suppress(Exception):  # teardown problems must not hide the result
        reset_state()


def worker_environment(
    rank: int, world_size: int, port: int, use_cpu: bool, env: Mapping[str, str] | None
) -> dict[str, str]:
    """The variables one spawned worker starts with (torchrun's, plus ``ACCEL_USE_CPU``)."""
    return {**pool_environment(rank, world_size, port, use_cpu), **(dict(env) if env else {})}


def spawn_workers(
    function: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    use_cpu: bool = True,
    reuse: bool | None = None,
) -> list[Any]:
    """Run ``function(*args)`` on ``world_size`` processes set up like ``torchrun`` does.

    Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``OMP_NUM_THREADS=1`` and, unless ``use_cpu=False``,
    ``ACCEL_USE_CPU=true`` (plus ``env``), so ``PartialState()`` inside it joins one gloo group on
    the CPU even on a machine with GPUs. ``function`` must be importable (module level) because
    processes are spawned.

    With reuse on, the job runs on a shared :class:`~accel_state.testing.pool.WorkerPool`:
    processes started once that run job after job, resetting accel's state and the process group
    in between (the pytest plugin turns reuse on; ``ACCEL_TEST_FRESH_WORKERS=1`` turns it off).
    A test that needs processes of its own by nature (signals, exits, what a process reads when
    it starts) passes ``reuse=False``.

    The error names the first rank that failed for a reason of its own, with its traceback: a
    peer's "connection closed" or timeout is recognised as a consequence, and while only such
    failures are in, the parent waits up to :data:`FAILURE_GRACE_SECONDS` for the cause.

    Args:
        function: Module-level callable to run in every process.
        world_size: Number of processes.
        args: Positional arguments for ``function``.
        timeout: Seconds before unfinished workers are killed.
        env: Extra environment variables (they override the defaults above).
        use_cpu: Force the CPU device and gloo; pass ``False`` for tests of accelerator choice.
        reuse: ``True`` runs on a shared pool, ``False`` on fresh processes, ``None`` (default)
            follows :data:`~accel_state.testing.pool.SHARED_POOLS`.

    Returns:
        The return values, indexed by rank.

    Raises:
        WorkerFailedError: A worker raised; the others are killed.
        WorkersTimedOutError: Not all workers finished within ``timeout`` seconds.

    """
    if reuse is None:
        reuse = SHARED_POOLS.reuse_wanted()
    if reuse:
        pool = SHARED_POOLS.pool_for(world_size, use_cpu, env)
        return pool.run(function, args, timeout=timeout, env=env)
    return _run_on_fresh_processes(function, world_size, args, timeout, env, use_cpu)


def _run_on_fresh_processes(
    function: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    timeout: float,
    env: Mapping[str, str] | None,
    use_cpu: bool,
) -> list[Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = find_free_port()
    processes = []
    for rank in range(world_size):
        environ = worker_environment(rank, world_size, port, use_cpu, env)
        process = context.Process(
            target=_worker_main, args=(function, args, rank, environ, results), daemon=False
        )
        # The child inherits the environment at start, before it imports anything (torch reads
        # OMP_NUM_THREADS when it is imported, which happens before _worker_main runs).
        with patch_environment(**environ):
            process.start()
        processes.append(process)
    collector = ReportCollector(world_size)
    try:
        collect_reports(collector, processes, results, time.monotonic() + timeout, timeout)
    finally:
        succeeded = len(collector.values) == world_size
        for process in processes:
            if succeeded:
                process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        results.close()
    return [collector.values[rank] for rank in range(world_size)]
