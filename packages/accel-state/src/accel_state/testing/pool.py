"""Long-lived test workers: one set of spawned processes runs job after job, a fresh group each time.

Starting a worker costs an interpreter and ``import torch`` (2-5 s on a busy core); the collectives
a test checks take milliseconds. A :class:`WorkerPool` starts its processes once and ships every
job to them: each job gets a new rendezvous port, the parent's current environment and
``sys.path``, and its own output file per rank (forwarded to the parent's stdout afterwards, so
pytest shows it with the test that ran it). After each job every worker resets accel's
process-wide state, destroys any process group left, and restores what a test may change in a
process (working directory, environment, signal handlers, torch defaults, logging, warnings).

A pool that failed in any way (a rank raised, a deadline passed, a worker died, cleanup failed) is
killed, and the next job gets fresh processes: nothing that may be broken is trusted again.

:data:`SHARED_POOLS` holds the pools :func:`~accel_state.testing.spawn_workers` reuses (the pytest
plugin switches reuse on and closes them at the end of the run).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_state.contract import USE_CPU
from accel_state.envvars import patch_environment, str_to_bool
from accel_state.testing.ports import find_free_port
from accel_state.testing.reports import ReportCollector, collect_reports, run_for_report

#: Variables read when a process starts or first imports a library, and cached from then on: a
#: job that needs other values than a pool's processes started with gets a pool of its own.
START_TIME_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "PJRT_DEVICE",
    "DS_ACCELERATOR",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TORCH_LOGS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONHASHSEED",
)
#: Set to 1 to make :func:`~accel_state.testing.spawn_workers` start fresh processes every time.
FRESH_WORKERS_VARIABLE = "ACCEL_TEST_FRESH_WORKERS"
#: Seconds a pool waits for its workers to finish cleaning up after a job before giving up on it.
CLEANUP_SECONDS = 60.0
#: Signals whose handlers a job may replace; each is restored after the job.
_RESTORED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)
_PR_SET_PDEATHSIG = 1


class PoolClosedError(RuntimeError):
    """A job was given to a pool that has been closed."""


def pool_environment(rank: int, world_size: int, port: int, use_cpu: bool) -> dict[str, str]:
    """The torchrun-style variables of one rank for one job (plus ``ACCEL_USE_CPU``)."""
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
    return environ


def start_time_values(environ: Mapping[str, str]) -> tuple[tuple[str, str | None], ...]:
    """The :data:`START_TIME_VARIABLES` of ``environ``, as part of a pool's key."""
    return tuple((name, environ.get(name)) for name in START_TIME_VARIABLES)


class WorkerPool:
    """``world_size`` spawned processes that run one job after another as a gloo group.

    Args:
        world_size: Number of processes (ranks of every job).
        use_cpu: Give every job ``ACCEL_USE_CPU=true`` (the CPU device and gloo).
        start_environ: Extra variables the processes start with (see :data:`START_TIME_VARIABLES`).

    """

    def __init__(
        self, world_size: int, use_cpu: bool = True, start_environ: Mapping[str, str] | None = None
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be at least 1.")
        self.world_size = world_size
        self.use_cpu = use_cpu
        self.jobs_run = 0
        context = multiprocessing.get_context("spawn")
        self._results = context.Queue()
        self._ready = context.Queue()
        self._tasks = [context.Queue() for _ in range(world_size)]
        self._processes: list[Any] = []
        self._closed = False
        start = pool_environment(0, world_size, 0, use_cpu) | dict(start_environ or {})
        for rank in range(world_size):
            process = context.Process(
                target=_pool_worker_main,
                args=(rank, self._tasks[rank], self._results, self._ready),
                daemon=False,  # a job may start DataLoader workers of its own
                name=f"accel-pool-rank{rank}",
            )
            # Variables torch reads on import must be there before the child imports anything.
            with patch_environment(**start):
                process.start()
            self._processes.append(process)
        # Registered after multiprocessing's own exit hook (imported by start()), so it runs
        # first: that hook would otherwise wait for these non-daemonic workers forever.
        atexit.register(self.close)

    @property
    def pids(self) -> list[int | None]:
        """The process ids of the workers, by rank."""
        return [process.pid for process in self._processes]

    @property
    def alive(self) -> bool:
        """Whether the pool is open and every worker is running."""
        return not self._closed and all(process.is_alive() for process in self._processes)

    def run(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...] = (),
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> list[Any]:
        """Run ``function(*args)`` on every worker as one job; the return values by rank.

        Each rank sees the parent's current environment, the job's torchrun variables (a new
        ``MASTER_PORT``) and ``env`` on top. On any failure the pool is closed.

        Raises:
            PoolClosedError: The pool was closed.
            WorkerFailedError: A rank raised (the error names the first that failed).
            WorkersTimedOutError: Not every rank finished within ``timeout`` seconds.

        """
        if not self.alive:
            self.close()
            raise PoolClosedError(
                "This worker pool is closed (a job failed or close() was called)."
            )
        payload = pickle.dumps((function, args))
        port = find_free_port()
        outputs = [_output_file(rank) for rank in range(self.world_size)]
        search_path = list(sys.path)
        for rank, output in enumerate(outputs):
            environ = {
                **os.environ,
                **pool_environment(rank, self.world_size, port, self.use_cpu),
                **(dict(env) if env else {}),
            }
            self._tasks[rank].put((search_path, environ, str(output), payload))
        collector = ReportCollector(self.world_size)
        try:
            collect_reports(
                collector, self._processes, self._results, time.monotonic() + timeout, timeout
            )
            self._await_cleanup()
        except BaseException:
            self.close()
            raise
        finally:
            _forward_output(outputs)
        self.jobs_run += 1
        return [collector.values[rank] for rank in range(self.world_size)]

    def _await_cleanup(self) -> None:
        """Wait until every worker has cleaned up after the job; close the pool if one did not."""
        deadline = time.monotonic() + CLEANUP_SECONDS
        problems: list[str] = []
        for _ in range(self.world_size):
            try:
                _, problem = self._ready.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                problems.append(f"a worker did not clean up within {CLEANUP_SECONDS:.0f} s")
                break
            if problem:
                problems.append(problem)
        if problems:
            # The job itself succeeded: its values stand, the processes are not reused.
            warnings.warn(
                "accel worker pool: closed after a job whose cleanup failed (the next job gets "
                "fresh processes): " + "\n".join(problems),
                RuntimeWarning,
                stacklevel=3,
            )
            self.close()

    def close(self) -> None:
        """Stop the workers (killing any still busy); the pool cannot run jobs afterwards."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for tasks in self._tasks:
            with contextlib.suppress(Exception):
                tasks.put(None)
        deadline = time.monotonic() + 5.0
        for process in self._processes:
            process.join(timeout=max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for channel in (*self._tasks, self._results, self._ready):
            channel.close()
            channel.cancel_join_thread()


@dataclass
class SharedPools:
    """The pools :func:`~accel_state.testing.spawn_workers` reuses: the process-wide registry.

    Pools are keyed by world size, ``use_cpu`` and the :data:`START_TIME_VARIABLES` their
    processes started with; at most ``limit`` stay open (the least recently used closes first).
    """

    enabled: bool = False
    limit: int = 3
    _pools: OrderedDict[tuple[Any, ...], WorkerPool] = field(default_factory=OrderedDict)

    def reuse_wanted(self) -> bool:
        """Whether jobs should go to a shared pool (on, and not overridden by the environment)."""
        fresh = os.environ.get(FRESH_WORKERS_VARIABLE, "")
        return self.enabled and not str_to_bool(fresh, True, name=FRESH_WORKERS_VARIABLE)

    def pool_for(
        self, world_size: int, use_cpu: bool, env: Mapping[str, str] | None = None
    ) -> WorkerPool:
        """An open pool for a job of ``world_size`` ranks with ``env``: reused, or started."""
        environ = {**os.environ, **(dict(env) if env else {})}
        key = (world_size, use_cpu, start_time_values(environ))
        pool = self._pools.pop(key, None)
        if pool is None or not pool.alive:
            if pool is not None:
                pool.close()
            starting = {name: value for name, value in key[2] if value is not None}
            pool = WorkerPool(world_size, use_cpu, starting)
        self._pools[key] = pool
        while len(self._pools) > self.limit:
            _, oldest = self._pools.popitem(last=False)
            oldest.close()
        return pool

    def close_all(self) -> None:
        """Close every pool (at the end of a test run, and at interpreter exit)."""
        while self._pools:
            _, pool = self._pools.popitem()
            pool.close()


#: The one registry of shared pools in this process.
SHARED_POOLS = SharedPools()


def _output_file(rank: int) -> Path:
    handle, name = tempfile.mkstemp(prefix=f"accel-pool-rank{rank}-", suffix=".log")
    os.close(handle)
    return Path(name)


def _forward_output(outputs: list[Path]) -> None:
    """Print what each rank wrote during the job (then delete the files)."""
    for rank, path in enumerate(outputs):
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace")
            path.unlink()
            if text:
                sys.stdout.write(f"----- rank {rank} output -----\n{text}")
                if not text.endswith("\n"):
                    sys.stdout.write("\n")
    sys.stdout.flush()


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Send this process's file descriptors 1 and 2 to ``path`` for a block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    with open(path, "ab", buffering=0) as target:
        os.dup2(target.fileno(), 1)
        os.dup2(target.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


class _ProcessBaseline:
    """What a job may change in a worker process, as it was before the first job."""

    def __init__(self) -> None:
        import torch

        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.handlers = {number: signal.getsignal(number) for number in _RESTORED_SIGNALS}
        self.dtype = torch.get_default_dtype()
        self.threads = torch.get_num_threads()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.root_level = logging.root.level
        self.root_handlers = list(logging.root.handlers)

    def restore(self) -> None:
        import torch

        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        for number, handler in self.handlers.items():
            signal.signal(number, handler)
        torch.set_default_dtype(self.dtype)
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.set_grad_enabled(True)
        logging.root.setLevel(self.root_level)
        logging.root.handlers[:] = self.root_handlers


def _clean_up(baseline: _ProcessBaseline) -> str:
    """Reset accel's state and the process after a job; a traceback if that failed, else ""."""
    try:
        from accel_state.group_keeper import free_destroyed_groups
        from accel_state.process_group import forget_rendezvous, stop_process_group
        from accel_state.shared import reset_state

        reset_state()
        # A group the job started itself, and the subgroups it made: kept until they are freed
        # below, so destroying them never drops a last reference while a gloo worker thread
        # still frees a Python object (torch 2.4-2.7 hold the GIL while joining it).
        stop_process_group()
        forget_rendezvous()
        baseline.restore()
        gc.collect()
        free_destroyed_groups()  # the job's objects are gone: its groups' threads can go too
    except BaseException:  # noqa: BLE001 - reported to the parent, which closes the pool
        return traceback.format_exc()
    return ""


def _call_shipped(payload: bytes) -> Any:
    """Unpickle a shipped ``(function, args)`` and call it (an unpicklable job fails as a job)."""
    function, args = pickle.loads(payload)
    return function(*args)


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the parent dies (best effort elsewhere)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _pool_worker_main(rank: int, tasks: Any, results: Any, ready: Any) -> None:
    _die_with_parent()
    baseline = _ProcessBaseline()
    parent = os.getppid()
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return  # the parent is gone
            continue
        if task is None:
            # No interpreter teardown: nothing of a job is left to finish, and the teardown of
            # the libraries jobs imported only prints warnings into a terminal no test reads.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        search_path, environ, output, payload = task
        # catch_warnings restores the warning filters a job may change.
        with _output_to(output), warnings.catch_warnings():
            sys.path[:] = [*search_path, *(entry for entry in sys.path if entry not in search_path)]
            os.environ.clear()
            os.environ.update(environ)
            results.put((rank, *run_for_report(_call_shipped, (payload,))))  # before cleanup
            problem = _clean_up(baseline)
        ready.put((rank, problem))
