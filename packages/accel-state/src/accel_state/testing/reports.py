"""What the workers of one test job reported: their values, or the error naming who failed first."""

from __future__ import annotations

import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from accel_state.errors import AccelStateError
from accel_state.failures import RankFailure, first_failure


class WorkerFailedError(AccelStateError, RuntimeError):
    """A worker raised; the message holds its rank and traceback."""


class WorkersTimedOutError(AccelStateError, TimeoutError):
    """Workers did not all finish before the deadline; they were killed."""


#: Seconds the parent keeps collecting reports when the only failures so far are consequences
#: (a peer's "connection closed"), so that the root cause, reported a moment later, is among them.
FAILURE_GRACE_SECONDS = 5.0


def run_for_report(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, float, bytes]:
    """Run ``function(*args)`` in a worker: ``("ok", when, pickled value)`` or ``("error", ...)``.

    The error form holds the traceback; every failure is caught, ``SystemExit`` included, so
    that the parent hears of it. Put ``(rank, *report)`` on the results queue *before* tearing
    the process group down: teardown closes connections, and the peers' resulting "connection
    closed" errors must not reach the parent ahead of this rank's own.
    """
    try:
        return ("ok", time.time(), pickle.dumps(function(*args)))
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        return ("error", time.time(), traceback.format_exc().encode())


class ReportCollector:
    """What the parent has heard from the workers so far."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.values: dict[int, Any] = {}
        self.failures: dict[int, RankFailure] = {}

    @property
    def settled(self) -> set[int]:
        """Ranks that reported a value or a failure."""
        return set(self.values) | set(self.failures)

    @property
    def has_cause(self) -> bool:
        """Whether a failure that is not a consequence of another has been reported."""
        return any(not failure.secondary for failure in self.failures.values())

    def add(self, rank: int, status: str, when: float, payload: bytes) -> None:
        """Record one report: ``status`` "ok" with a pickled value, or "error" with a traceback."""
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


def collect_reports(
    collector: ReportCollector, processes: list[Any], results: Any, deadline: float, timeout: float
) -> None:
    """Read ``(rank, status, when, payload)`` reports until every rank succeeded.

    Raises:
        WorkerFailedError: Once the failures are all in (see :data:`FAILURE_GRACE_SECONDS`).
        WorkersTimedOutError: The deadline passed with ranks still silent and none failed.

    """
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
