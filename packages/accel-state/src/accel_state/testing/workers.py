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

from accel_state.contract import USE_CPU
from accel_state.envvars import patch_environment
from accel_state.errors import AccelStateError
from accel_state.failures import RankFailure, first_failure
from accel_state.testing.ports import find_free_port


class WorkerFailedError(AccelStateError, RuntimeError):
    """A worker raised; the message holds its rank and traceback."""


class WorkersTimedOutError(AccelStateError, TimeoutError):
    """Workers did not all finish before the deadline; they were killed."""


#: Seconds the parent keeps collecting reports when the only failures so far are consequences
#: (a peer's "connection closed"), so that the root cause, reported a moment later, is among them.
FAILURE_GRACE_SECONDS = 5.0


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
        payload = ("ok", time.time(), pickle.dumps(value))
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        payload = ("error", time.time(), traceback.format_exc().encode())
    # Report before tearing the group down: teardown closes connections, and the peers' resulting
    # "connection closed" errors must not reach the parent ahead of this rank's own.
    results.put((rank, *payload))
    from accel_state.shared import reset_state

    with contextlib.suppress(Exception):  # teardown problems must not hide the result
        reset_state()


def worker_environment(
    rank: int, world_size: int, port: int, use_cpu: bool, env: Mapping[str, str] | None
) -> dict[str, str]:
    """The variables one spawned worker starts with (torchrun's, plus ``ACCEL_USE_CPU``)."""
    environ = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    if use_cpu:
        environ[USE_CPU] = "true"
    return {**environ, **(dict(env) if env else {})}


class _Collector:
    """What the parent has heard from the workers so far."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.values: dict[int, Any] = {}
        self.failures: dict[int, RankFailure] = {}

    @property
    def settled(self) -> set[int]:
        return set(self.values) | set(self.failures)

    @property
    def has_cause(self) -> bool:
        """Whether a failure that is not a consequence of another has been reported."""
        return any(not failure.secondary for failure in self.failures.values())

    def add(self, rank: int, status: str, when: float, payload: bytes) -> None:
        if status == "error":
            self.failures[rank] = RankFailure(rank, when, payload.decode(errors="replace"))
        else:
            self.values[rank] = pickle.loads(payload)

    def note_silent_deaths(self, processes: list[Any]) -> None:
        """Ranks whose process exited non-zero without reporting count as failed now."""
        for rank, process in enumerate(processes):
            if rank not in self.settled and process.exitcode not in (None, 0):
                text = f"exited with code {process.exitcode} without reporting a result"
                self.failures[rank] = RankFailure(rank, time.time(), text)

    def error(self) -> WorkerFailedError:
        """The error naming the first failing rank, with the others listed as consequences."""
        first = first_failure(list(self.failures.values()))
        lines = [f"Rank {first.rank} of {self.world_size} failed first:", first.text.rstrip()]
        others = sorted(rank for rank in self.failures if rank != first.rank)
        if others:
            summaries = "; ".join(
                f"rank {rank}: {_last_line(self.failures[rank].text)}" for rank in others
            )
            lines.append(f"Also failed (after it): {summaries}")
        return WorkerFailedError("\n".join(lines))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


def spawn_workers(
    function: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    use_cpu: bool = True,
) -> list[Any]:
    """Run ``function(*args)`` on ``world_size`` fresh processes set up like ``torchrun`` does.

    Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``OMP_NUM_THREADS=1`` and, unless ``use_cpu=False``,
    ``ACCEL_USE_CPU=true`` (plus ``env``), so ``PartialState()`` inside it joins one gloo group on
    the CPU even on a machine with GPUs. ``function`` must be importable (module level) because
    processes are spawned.

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

    Returns:
        The return values, indexed by rank.

    Raises:
        WorkerFailedError: A worker raised; the others are killed.
        WorkersTimedOutError: Not all workers finished within ``timeout`` seconds.

    """
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
    collector = _Collector(world_size)
    try:
        _collect(collector, processes, results, time.monotonic() + timeout, timeout)
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


def _collect(
    collector: _Collector, processes: list[Any], results: Any, deadline: float, timeout: float
) -> None:
    """Read reports until every rank succeeded, or raise once the failures are all in."""
    world_size = collector.world_size
    grace_end: float | None = None
    while len(collector.settled) < world_size:
        now = time.monotonic()
        if collector.has_cause or (grace_end is not None and now >= grace_end):
            break
        if now >= deadline:
            if collector.failures:
                break
            missing = sorted(set(range(world_size)) - collector.settled)
            raise WorkersTimedOutError(
                f"Ranks {missing} of {world_size} did not finish within {timeout:.0f} s; killed."
            )
        try:
            collector.add(*results.get(timeout=min(deadline - now, 0.5)))
        except queue.Empty:
            collector.note_silent_deaths(processes)
        if collector.failures and grace_end is None:
            grace_end = time.monotonic() + FAILURE_GRACE_SECONDS
    if collector.failures:
        raise collector.error()
