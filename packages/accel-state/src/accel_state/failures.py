"""Which rank of a failed job failed first, and which failures were only consequences of it.

When one rank of a job raises, its peers usually fail a moment later with a transport error (gloo's
"Connection closed by peer", NCCL's aborted communicator, a TCP store that went away). Those are
consequences, not causes. :func:`first_failure` picks the earliest failure that is not such a
consequence, so ``spawn_workers`` and ``accel launch`` report the rank whose traceback explains the
failure, whatever order the reports arrive in.

Libraries in a worker can also say where the worker was when it failed: :func:`register_reporter`
adds a function whose one-line answer (accel-ops: "waits in gather #57 (train.py:42)") the
launcher's failure recorder writes into torch elastic's error file (under
:data:`accel_state.contract.COLLECTIVES_KEY`), so the launcher can put every rank side by side.
:func:`register_translator` adds one that explains an error that reached the top of the
worker (accel-ops: a raw gloo timeout raised inside DDP or a user's own ``torch.distributed``
call, outside accel's collectives); the recorder reports the translation.
This module imports the standard library only: the recorder reads it from a worker's
``sys.modules`` without importing anything.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

#: Phrases of errors a rank hits because another rank died or left: transport and store errors.
SECONDARY_FAILURE_PATTERNS: tuple[str, ...] = (
    r"Connection closed by peer",
    r"Connection reset by peer",
    r"Broken pipe",
    r"ECONNRESET",
    r"EPIPE",
    r"Connection refused",
    r"failed to recv, got 0 bytes",
    r"Socket Timeout",
    r"NCCL communicator was aborted",
    r"remote process exited or there was a network error",
    r"DistNetworkError",
    r"DistStoreError",
    r"Timed out waiting \d+ ?ms for (?:send|recv) operation",
    r"nothing was committed\. rank \d+",
    r"stopped by SIGTERM",
)
_SECONDARY = re.compile("|".join(SECONDARY_FAILURE_PATTERNS))


def is_secondary_failure(text: str) -> bool:
    """Whether an error text reads like a consequence of a peer's failure (a transport error)."""
    return _SECONDARY.search(text) is not None


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """One rank's failure.

    Attributes:
        rank: Global rank.
        timestamp: When it failed (seconds since the epoch, from ``time.time()``).
        text: The error text or traceback, when known.
    """

    rank: int
    timestamp: float
    text: str = ""

    @property
    def secondary(self) -> bool:
        """Whether this failure reads like a consequence of another rank's."""
        return is_secondary_failure(self.text)


def first_failure(failures: Sequence[RankFailure]) -> RankFailure:
    """The failure to report: the earliest that is not a consequence, else the earliest of all.

    Ties in time go to the lower rank.

    Raises:
        ValueError: ``failures`` is empty.
    """
    if not failures:
        raise ValueError("first_failure() needs at least one failure.")
    causes = [failure for failure in failures if not failure.secondary]
    return min(causes or failures, key=lambda failure: (failure.timestamp, failure.rank))


# Wiring, not state: libraries register once at import, and reset_state() keeps them.
_REPORTERS: dict[str, Callable[[], str]] = {}
_TRANSLATORS: list[Callable[[BaseException], BaseException]] = []


def register_translator(translator: Callable[[BaseException], BaseException]) -> None:
    """Have ``translator`` explain an error that ends a worker (accel-ops: a raw gloo timeout).

    Args:
        translator: Returns the error to report instead, or the same error; it must not raise.
    """
    if translator not in _TRANSLATORS:
        _TRANSLATORS.append(translator)


def translate(error: BaseException) -> BaseException:
    """The error to report for ``error``, which ends this process: the first translation made."""
    for translator in list(_TRANSLATORS):
        try:
            translated = translator(error)
        except Exception:  # noqa: BLE001 - a report must never mask the failure it describes
            continue
        if translated is not error:
            return translated
    return error


def register_reporter(name: str, reporter: Callable[[], str]) -> None:
    """Have ``reporter()`` describe this process when it fails (replaces one of the same name).

    Args:
        name: Who reports, e.g. ``"collectives"``.
        reporter: Returns one line (empty when there is nothing to say); it must not raise.
    """
    _REPORTERS[name] = reporter


def failure_reports() -> dict[str, str]:
    """Every registered reporter's line, by name; reporters that raise or say nothing are left out."""
    lines = {}
    for name, reporter in list(_REPORTERS.items()):
        try:
            line = reporter()
        except Exception:  # noqa: BLE001 - a report must never mask the failure it describes
            continue
        if line:
            lines[name] = line
    return lines
