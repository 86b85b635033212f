"""Name the slow machine: per-rank step times, exchanged every N steps, against the median.

In synchronous data parallel training every rank waits for the slowest in each gradient
all-reduce, so the step time is the same everywhere and a slow host (a throttled GPU, a busy
CPU, a slow disk feeding the loader) only shows as a slower job. What differs is the time each
rank spends *outside* the backward pass: data loading, forward, the optimizer step and the
script's own code, from the end of one ``accelerator.backward`` to the start of the next. Every
:data:`DEFAULT_INTERVAL` backward passes the ranks all-gather their mean of that time (one small
collective); the main process names each rank whose mean exceeds the median by more than the
threshold, with its host, once for as long as the set of slow ranks stays the same.

Settings (environment, read once per Accelerator):

* ``ACCEL_SLOW_RANK_INTERVAL``: backward passes between exchanges (default 100; ``0`` turns the
  report off);
* ``ACCEL_SLOW_RANK_THRESHOLD``: how much slower than the median counts as slow, as a fraction
  (default 0.2, i.e. 20 %).

It runs only with a process group of more than one process on gloo or NCCL.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch

import accel_ops
from accel.errors import AccelError
from accel_ops.records import record
from accel_state import PartialState

logger = logging.getLogger(__name__)

INTERVAL_ENV = "ACCEL_SLOW_RANK_INTERVAL"
THRESHOLD_ENV = "ACCEL_SLOW_RANK_THRESHOLD"
DEFAULT_INTERVAL = 100
DEFAULT_THRESHOLD = 0.2
#: A rank is slow only when also this many seconds per step slower than the median: a few
#: microseconds of jitter on a tiny step is not a slow machine.
MIN_DIFFERENCE_SECONDS = 0.001


def _setting(name: str, default: float, kind: type) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(kind(text))
    except ValueError:
        value = -1.0
    if value < 0:
        raise AccelError(
            f"{name}={text!r} must be a non-negative {kind.__name__}; e.g. {name}={default} "
            f"(the default), or unset it."
        )
    return value


class SlowRankMonitor:
    """Times each rank's work between backward passes and reports ranks slower than the median.

    Args:
        state: The process's state (ranks, backend, device).
    """

    def __init__(self, state: PartialState) -> None:
        self.state = state
        self.interval = int(_setting(INTERVAL_ENV, DEFAULT_INTERVAL, int))
        self.threshold = float(_setting(THRESHOLD_ENV, DEFAULT_THRESHOLD, float))
        self.enabled = (
            self.interval > 0
            and state.num_processes > 1
            and state.backend in ("gloo", "nccl")
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        )
        self._outside = 0.0  # seconds outside backward in this window
        self._counted = 0  # gaps measured in this window
        self._calls = 0  # backward passes so far
        self._last_end: float | None = None
        self._reported: frozenset[int] = frozenset()
        self.last_report = ""

    def before_backward(self) -> None:
        """At the start of every backward pass: count the gap, exchange every ``interval``."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._last_end is not None:
            self._outside += now - self._last_end
            self._counted += 1
        self._calls += 1
        if self._calls % self.interval == 0:
            self._exchange()

    def restart_gap(self) -> None:
        """Forget when the last backward ended (after a pause, the gap is not the rank's work)."""
        self._last_end = None

    def after_backward(self) -> None:
        """At the end of every backward pass."""
        if self.enabled:
            self._last_end = time.perf_counter()

    def _exchange(self) -> None:
        mean = self._outside / self._counted if self._counted else 0.0
        self._outside, self._counted = 0.0, 0
        device = self.state.device if self.state.backend == "nccl" else torch.device("cpu")
        mine = torch.tensor([mean], dtype=torch.float64, device=device)
        with record("slow-rank report"):
            gathered = accel_ops.gather(mine, debug=False)
        if self.state.is_main_process:
            self._report([float(value) for value in gathered.tolist()])
        self._last_end = time.perf_counter()  # the exchange is not the rank's own work

    def _report(self, seconds: list[float]) -> None:
        median = statistics.median(seconds)
        slow = frozenset(
            rank
            for rank, value in enumerate(seconds)
            if value > median * (1 + self.threshold) and value - median > MIN_DIFFERENCE_SECONDS
        )
        if slow == self._reported:
            return
        self._reported = slow
        if not slow:
            return
        from accel_state.job_hosts import posted_hosts, ranks_by_host
        from accel_state.process_group import job_store

        store = job_store()
        hosts = posted_hosts(store, sorted(slow)) if store is not None else {}
        parts = []
        for rank in sorted(slow):
            where = ranks_by_host([rank], hosts)
            percent = 100 * (seconds[rank] / median - 1) if median > 0 else float("inf")
            parts.append(
                f"{where}: {seconds[rank] * 1000:.1f} ms per step outside backward, "
                f"{percent:.0f}% above the median {median * 1000:.1f} ms"
            )
        self.last_report = (
            f"accel: slow ranks over backward passes {self._calls - self.interval + 1}-"
            f"{self._calls}: {'; '.join(parts)}. Every rank waits for them in each gradient "
            f"all-reduce. ({INTERVAL_ENV}={self.interval}, {THRESHOLD_ENV}={self.threshold:g}; "
            f"{INTERVAL_ENV}=0 turns this report off)"
        )
        logger.warning(self.last_report)
