"""Name the slow machine, and where its time goes: data, forward, backward or the optimizer step.

In synchronous data parallel training every rank waits for the slowest in each gradient
all-reduce, so the step time is the same everywhere and a slow host (a throttled GPU, a busy
CPU, a slow disk feeding the loader) only shows as a slower job. What differs between ranks is
each rank's *own* work in each phase of a step, which this monitor times on every rank:

* **data**: from the loop asking a prepared dataloader for a batch to the batch being ready;
* **backward**: from the start of ``accelerator.backward`` to this rank's last gradient bucket
  being ready to sum (DDP: accel's communication hook sees each bucket; the wait for the other
  ranks comes after that);
* **optimizer**: ``optimizer.step()``;
* **forward**: the rest of the time between two backward passes (the forward pass and the
  script's own code).

Time inside accel's recorded collectives (``gather``, ``should_stop``, ``save_state``...) is
waiting for the others, not work, and is taken out of each phase. A phase in which the strategy
itself waits for the other ranks is not compared at all (a fast rank waiting there would look
slow): :attr:`~accel.strategies.base.ModelStrategy.phases_without_waiting` says which are clean
(FSDP: data and optimizer; DeepSpeed: data), and backward counts only where
:meth:`~accel.strategies.base.ModelStrategy.gradients_ready_at` answers.

Every :data:`DEFAULT_INTERVAL` backward passes the ranks all-gather their median per step of
each phase over that window: one small collective, started before that backward pass and read
after it, so that it runs beside the gradient all-reduce instead of adding a wait of its own. The main process names a rank in a phase
when its median exceeds the typical rank's (the lower quartile of the ranks, see
:func:`_reference`) by more than :data:`DEFAULT_MIN_SECONDS` *and* by more than the threshold
times the typical step, in :data:`CONFIRMING_WINDOWS` windows in a row:
the jitter of a busy machine is neither large nor lasting, a slow machine is both. A report is
said once for as long as the same ranks stay slow in the same phases.

Settings (environment, read once per Accelerator):

* ``ACCEL_SLOW_RANK_INTERVAL``: backward passes per window (default 10; ``0`` turns it off);
* ``ACCEL_SLOW_RANK_THRESHOLD``: how much of the typical step a rank must lose in one phase to
  count as slow (default 0.1, i.e. 10 %);
* ``ACCEL_SLOW_RANK_MIN_MS``: and at least this many milliseconds per step (default 10).

It runs only with a process group of more than one process on gloo or NCCL.
"""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch
import torch.distributed as dist

from accel.errors import AccelError
from accel.strategies.base import PHASES_WITHOUT_WAITING, ModelStrategy
from accel_ops.records import record, seconds_in_records
from accel_state import PartialState

logger = logging.getLogger(__name__)

INTERVAL_ENV = "ACCEL_SLOW_RANK_INTERVAL"
THRESHOLD_ENV = "ACCEL_SLOW_RANK_THRESHOLD"
MIN_MS_ENV = "ACCEL_SLOW_RANK_MIN_MS"
DEFAULT_INTERVAL = 10
DEFAULT_THRESHOLD = 0.1
DEFAULT_MIN_SECONDS = 0.010
#: Windows in a row a rank must be slow in the same phase before it is named.
CONFIRMING_WINDOWS = 2
#: The phases of a step, in the order each rank sends them.
PHASES = ("data", "forward", "backward", "optimizer")
_DESCRIPTIONS = {
    "data": "in data loading",
    "forward": "in forward and the script's own code",
    "backward": "in backward",
    "optimizer": "in the optimizer step",
}


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
            f"{name}={text!r} must be a non-negative {kind.__name__}; e.g. {name}={default:g} "
            f"(the default), or unset it."
        )
    return value


#: A phase not timed (or not comparable) in a step or a window.
_UNKNOWN = float("nan")


def _median(values: list[float]) -> float:
    """The median of the known values (NaN: unknown), NaN when none is known."""
    known = [value for value in values if value == value]
    return statistics.median(known) if known else _UNKNOWN


def _reference(values: list[float]) -> float:
    """What a rank is compared with: the lower quartile of the ranks' known values.

    Not the median: when a whole machine is slow, half the ranks of a two-machine job are, and
    the median would sit halfway between them and the others.
    """
    known = sorted(value for value in values if value == value)
    if len(known) < 2:
        return _UNKNOWN
    return statistics.quantiles(known, n=4, method="inclusive")[0]


class _Stopwatch:
    """Own time of one phase: wall time less the time spent in recorded collectives meanwhile."""

    __slots__ = ("collectives", "started")

    def __init__(self) -> None:
        self.started: float | None = None
        self.collectives = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.collectives = seconds_in_records()

    def stop(self) -> float:
        """Own seconds since :meth:`start` (0 when it was not started)."""
        if self.started is None:
            return 0.0
        elapsed = time.perf_counter() - self.started - (seconds_in_records() - self.collectives)
        self.started = None
        return max(elapsed, 0.0)


class SlowRankMonitor:
    """Times each rank's phases of a step and names ranks slower than the typical rank in one.

    Args:
        state: The process's state (ranks, backend, device).
        strategy: The model strategy: its backward clock and the phases in which it never
            waits for other ranks (None: a plain single-model loop, every phase but backward).
    """

    def __init__(self, state: PartialState, strategy: ModelStrategy | None = None) -> None:
        self.state = state
        self.strategy = strategy
        self.interval = int(_setting(INTERVAL_ENV, DEFAULT_INTERVAL, int))
        self.threshold = float(_setting(THRESHOLD_ENV, DEFAULT_THRESHOLD, float))
        self.min_seconds = _setting(MIN_MS_ENV, DEFAULT_MIN_SECONDS * 1000, float) / 1000
        self.enabled = (
            self.interval > 0
            and state.num_processes > 1
            and state.backend in ("gloo", "nccl")
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        )
        self._gap = _Stopwatch()  # from the end of one backward to the start of the next
        self._fetch = _Stopwatch()
        self._step = _Stopwatch()
        self._data = 0.0  # own seconds in data loading in the gap so far
        self._optimizer = 0.0  # own seconds in the optimizer step in the gap so far
        self._pending: tuple[float, float, float] | None = None  # data, forward, optimizer
        self._backward_started = 0.0
        self._samples: list[tuple[float, float, float, float]] = []  # this window's steps
        self._calls = 0  # backward passes so far
        self.windows = 0  # windows exchanged so far
        #: The window's all-gather, started before a backward pass and read after it.
        self._in_flight: tuple[dist.Work | None, list[torch.Tensor]] | None = None
        self._streaks: dict[tuple[int, str], int] = {}
        self._reported: frozenset[tuple[int, str]] = frozenset()
        self.last_report = ""

    # ------------------------------------------------------------------ timing
    def fetch_started(self) -> None:
        """The loop asked a prepared dataloader for a batch."""
        if self.enabled:
            self._fetch.start()

    def fetch_finished(self) -> None:
        """The batch is ready."""
        if self.enabled:
            self._data += self._fetch.stop()

    def step_started(self) -> None:
        """The optimizer step begins."""
        if self.enabled:
            self._step.start()

    def step_finished(self) -> None:
        """The optimizer step ended."""
        if self.enabled:
            self._optimizer += self._step.stop()

    def before_backward(self) -> None:
        """At the start of every backward pass: close the gap, exchange every ``interval``."""
        if not self.enabled:
            return
        if self._gap.started is not None:
            gap = self._gap.stop()
            forward = max(gap - self._data - self._optimizer, 0.0)
            self._pending = (self._data, forward, self._optimizer)
        self._data = self._optimizer = 0.0
        self._calls += 1
        if self._calls % self.interval == 0:
            self._exchange()
        self._backward_started = time.perf_counter()

    def after_backward(self) -> None:
        """At the end of every backward pass: this step's sample, and the next gap starts."""
        if not self.enabled:
            return
        ready = self.strategy.gradients_ready_at() if self.strategy is not None else None
        started = self._backward_started
        backward = ready - started if ready is not None and ready >= started else _UNKNOWN
        if self._pending is not None:
            data, forward, optimizer = self._pending
            self._samples.append((data, forward, backward, optimizer))
            self._pending = None
        self._collect()
        self._gap.start()

    def restart_gap(self) -> None:
        """Forget the gap in progress (after a pause, the time is not the rank's work)."""
        self._gap.started = None
        self._pending = None
        self._data = self._optimizer = 0.0

    # ------------------------------------------------------------------ the exchange
    def _exchange(self) -> None:
        samples, self._samples = self._samples, []
        self.windows += 1
        clean = {"backward"} | (
            self.strategy.phases_without_waiting
            if self.strategy is not None
            else PHASES_WITHOUT_WAITING
        )
        mine = [
            _median([sample[index] for sample in samples]) if phase in clean else _UNKNOWN
            for index, phase in enumerate(PHASES)
        ]
        device = self.state.device if self.state.backend == "nccl" else torch.device("cpu")
        tensor = torch.tensor(mine, dtype=torch.float64, device=device)
        gathered = [torch.empty_like(tensor) for _ in range(self.state.num_processes)]
        with record("slow-rank report", tensor):
            work = dist.all_gather(gathered, tensor, async_op=True)
        self._in_flight = (work, gathered)

    def _collect(self) -> None:
        """Wait for the window's all-gather (it ran beside the backward pass) and judge it."""
        if self._in_flight is None:
            return
        work, gathered = self._in_flight
        self._in_flight = None
        with record("slow-rank report"):
            if work is not None:
                work.wait()
        if self.state.is_main_process:
            self._judge([row.cpu().tolist() for row in gathered])

    def _judge(self, medians: list[list[float]]) -> None:
        """Count each (rank, phase) slow in this window; report when the confirmed set changes.

        A phase a rank could not time is NaN there (and compared among the others only).
        """
        by_phase = [_reference([row[index] for row in medians]) for index in range(len(PHASES))]
        if all(value != value for value in by_phase):
            return
        step = sum(value for value in by_phase if value == value)
        margin = max(self.min_seconds, self.threshold * step)
        slow_now = {
            (rank, phase)
            for rank, row in enumerate(medians)
            for index, phase in enumerate(PHASES)
            if row[index] == row[index] and row[index] - by_phase[index] > margin
        }
        self._streaks = {key: self._streaks.get(key, 0) + 1 for key in slow_now}
        confirmed = frozenset(
            key for key, count in self._streaks.items() if count >= CONFIRMING_WINDOWS
        )
        if confirmed == self._reported:
            return
        self._reported = confirmed
        if confirmed:
            self._say(confirmed, medians, by_phase, step)

    def _say(
        self,
        slow: frozenset[tuple[int, str]],
        medians: list[list[float]],
        by_phase: list[float],
        step: float,
    ) -> None:
        from accel_state.job_hosts import posted_hosts, ranks_by_host
        from accel_state.process_group import job_store

        store = job_store()
        ranks = sorted({rank for rank, _ in slow})
        hosts = posted_hosts(store, ranks) if store is not None else {}
        parts = []
        for rank, phase in sorted(slow, key=lambda key: (key[0], PHASES.index(key[1]))):
            index = PHASES.index(phase)
            value, typical = medians[rank][index], by_phase[index]
            parts.append(
                f"{ranks_by_host([rank], hosts)}: {(value - typical) * 1000:.1f} ms per step "
                f"more than the typical rank {_DESCRIPTIONS[phase]} ({value * 1000:.1f} ms "
                f"against {typical * 1000:.1f} ms)"
            )
        first = self._calls - CONFIRMING_WINDOWS * self.interval + 1
        self.last_report = (
            f"accel: slow ranks over backward passes {max(first, 1)}-{self._calls}: "
            f"{'; '.join(parts)}. A typical rank spends {step * 1000:.1f} ms per step on its "
            f"own work in the phases compared; every rank waits for the slow ones. "
            f"({INTERVAL_ENV}={self.interval}, {THRESHOLD_ENV}={self.threshold:g}, "
            f"{MIN_MS_ENV}={self.min_seconds * 1000:g}; {INTERVAL_ENV}=0 turns this report off)"
        )
        logger.warning(self.last_report)
