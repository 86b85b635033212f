"""Helpers for testing distributed code with real processes: spawn workers, run torchrun, mark tests.

These are public so that accel's other packages, and libraries built on them, can test their own
collectives over real gloo process groups.
"""

from accel_state.testing.pool import SHARED_POOLS, WorkerPool
from accel_state.testing.ports import find_free_port
from accel_state.testing.torchrun import run_torchrun
from accel_state.testing.workers import WorkerFailedError, WorkersTimedOutError, spawn_workers
from accel_state.testing.xla import spawn_xla_workers

__all__ = [
    "SHARED_POOLS",
    "WorkerFailedError",
    "WorkerPool",
    "WorkersTimedOutError",
    "find_free_port",
    "run_torchrun",
    "spawn_workers",
    "spawn_xla_workers",
]
