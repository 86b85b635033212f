"""Turning a collective's timeout or transport error into one that says what and where.

gloo reports a hang as "Timed out waiting 10000ms for send operation", naming neither the
operation, nor the caller, nor the rank that never came. :func:`explain` replaces it with a
:class:`~accel_ops.errors.CollectiveTimeoutError` that names the operation, its sequence number
and the caller's line on this rank, where every other rank is (each rank that times out posts its
position in the rendezvous store and reads the others' for a few seconds), and the usual causes.
A peer that died gives a :class:`~accel_ops.errors.CollectiveFailedError` the same way. Other
errors (out of memory, a bad argument) pass through unchanged.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from accel_ops.errors import AccelOpsError, CollectiveFailedError, CollectiveTimeoutError
from accel_state.failures import is_secondary_failure

if TYPE_CHECKING:  # records calls explain(); the records themselves come in as arguments
    from accel_ops.records import CollectiveRecord

#: How long a rank that timed out waits for the others to post where they are.
PEER_WAIT_SECONDS = 5.0
#: How long a store read may block past its wait before the report goes on without it.
STORE_GRACE_SECONDS = 2.0
_TIMEOUT = re.compile(
    r"[Tt]imed out|[Tt]imeout|Watchdog caught collective operation timeout|DEADLINE_EXCEEDED"
)
#: Operations that every process must call, with the usual way to get that wrong.
_EVERY_PROCESS = {
    "save_state": "save_state is collective",
    "load_state": "load_state is collective",
    "save_model": "save_model gathers the weights",
    "get_state_dict": "get_state_dict gathers the weights",
    "wait_for_everyone": "wait_for_everyone is a barrier",
}
_KEY = "accel/collectives/{attempt}/{rank}"
_READ_KEY = "accel/collectives/{attempt}/read"
_SILENT = (
    f"no report within {PEER_WAIT_SECONDS:g} s (busy outside any collective, or waiting in one "
    "that has not timed out yet)"
)


def is_distributed_error(error: BaseException) -> bool:
    """Raised by torch.distributed itself: a ``DistError``, or gloo's plain ``RuntimeError``.

    Subclasses of ``RuntimeError`` raised by libraries (accel-ckpt's own errors, out of memory)
    carry their own explanation and pass through.
    """
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    if type(error) is not RuntimeError:
        return False
    text = str(error)
    return bool(_TIMEOUT.search(text)) or is_secondary_failure(text)


def explain(
    error: BaseException,
    entry: CollectiveRecord,
    history: Callable[[], list[CollectiveRecord]],
    where: Callable[[], str],
) -> BaseException:
    """The error to raise for ``error``, raised inside the collective ``entry``.

    Marks ``entry`` timed out or failed. Returns ``error`` itself when it is not a distributed
    failure (or already one of accel-ops' errors).

    Args:
        error: What the collective raised.
        entry: Its record.
        history: This process's records, oldest first (for "previous collectives").
        where: This process's position line, as the other ranks will read it.
    """
    entry.mark_failed()
    if isinstance(error, AccelOpsError) or not is_distributed_error(error):
        return error
    rank, world_size = _rank_and_size()
    waited = time.monotonic() - entry.started
    backend_says = _first_line(str(error))
    if _TIMEOUT.search(str(error)) or _peer_timed_out_first(waited):
        entry.mark_timed_out()
        positions = exchange_positions(rank, world_size, where())
        return CollectiveTimeoutError(
            _timeout_message(entry, rank, world_size, waited, positions, backend_says, history),
            operation=entry.op,
            descriptions=[positions.get(other, "") for other in range(world_size)],
        )
    return CollectiveFailedError(
        f"{entry.op} #{entry.seq} (called at {entry.site}) failed on rank {rank} of "
        f"{world_size} after {waited:.1f} s: another process left the job (it failed or was "
        f"stopped; its own error explains why). {_recent(entry, history)} [{backend_says}]",
        operation=entry.op,
    )


def _timeout_message(
    entry: CollectiveRecord,
    rank: int,
    world_size: int,
    waited: float,
    positions: dict[int, str],
    backend_says: str,
    history: Callable[[], list[CollectiveRecord]],
) -> str:
    lines = [
        f"{entry.op} #{entry.seq} (called at {entry.site}) timed out on rank {rank} of "
        f"{world_size} after {waited:.1f} s: not every process entered the matching collective."
    ]
    where = "; ".join(
        f"rank {other} {positions[other]}" if other in positions else f"rank {other}: {_SILENT}"
        for other in range(world_size)
    )
    lines.append(f"Where the processes are: {where}.")
    silent = [other for other in range(world_size) if other not in positions]
    if silent:
        lines.append(_silent_hosts(silent, world_size))
    alone = [
        op for op in _EVERY_PROCESS if any(f" in {op} #" in text for text in positions.values())
    ]
    for op in alone:
        lines.append(
            f"{_EVERY_PROCESS[op]}: call {op} on every process, not only under "
            "`if accelerator.is_main_process:`."
        )
    lines.append(
        "Every process must run the same collectives in the same order: look for a collective "
        "under a rank-dependent condition, an early break, or a data loader that gives ranks "
        "different numbers of batches. A slow step (compilation, saving) needs a longer "
        "timeout: InitProcessGroupKwargs(timeout=...) or accel launch --collective_timeout."
    )
    lines.append(_recent(entry, history))
    lines.append(f"[backend: {_without_transport_phrases(backend_says)}]")
    return "\n".join(lines)


def _silent_hosts(silent: list[int], world_size: int) -> str:
    """``Silent: ranks 2, 3 on node1 (198.18.0.11) ...``: where the ranks that did not answer run."""
    from accel_state.job_hosts import posted_hosts, ranks_by_host
    from accel_state.process_group import job_store

    store = job_store()
    hosts: dict[int, str] = {}
    if store is not None:
        within(STORE_GRACE_SECONDS, lambda: hosts.update(posted_hosts(store, range(world_size))))
    answered_hosts = {hosts[rank] for rank in hosts if rank not in silent}
    whole = sorted({hosts[rank] for rank in silent if rank in hosts} - answered_hosts)
    lost = (
        f" No process on {', '.join(host.split(' ')[0] for host in whole)} answered: that "
        "machine is lost, or its network link is down."
        if whole
        else ""
    )
    return f"Silent: {ranks_by_host(silent, hosts)}.{lost}"


def _recent(
    entry: CollectiveRecord, history: Callable[[], list[CollectiveRecord]], count: int = 3
) -> str:
    earlier = [other for other in history() if other.seq < entry.seq][-count:]
    if not earlier:
        return "It is the first collective this process entered."
    listed = ", ".join(f"{other.describe()} {other.state}" for other in earlier)
    return f"This process's previous collectives: {listed}."


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:300]


def _without_transport_phrases(text: str) -> str:
    """The backend's words, minus a timeout phrase that would mark this error as a consequence.

    ``accel_state.failures`` treats gloo's "Timed out waiting ... for send operation" as a peer's
    consequence; a rank that timed out waiting is a cause candidate, so the phrase is shortened.
    """
    text = re.sub(r"^\[[^\]]*\.cc:\d+\] ", "", text)  # gloo's source location
    return re.sub(
        r"Timed out waiting (\d+) ?ms for (send|recv) operation to complete",
        r"\2 timed out after \1 ms",
        text,
    )


def _timeout_seconds() -> float | None:
    """The collective timeout in force, as accel-state set it (None when it did not start the group)."""
    from accel_state.shared import shared_dict

    timeout = shared_dict("PartialState").get("timeout")
    return None if timeout is None else float(timeout.total_seconds())


def _peer_timed_out_first(waited: float) -> bool:
    """Whether a closed connection after this long means a peer gave up on the same hang.

    gloo closes the connection of a collective that times out, so of two ranks stuck in the same
    hang, the one whose timeout fires first makes the other fail with "Connection closed by
    peer" an instant before its own timeout would have: that rank timed out too.
    """
    timeout = _timeout_seconds()
    return timeout is not None and waited >= 0.5 * timeout


def _rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _attempt() -> int:
    from accel_state.shared import shared_dict

    contract = shared_dict("PartialState").get("contract")
    return int(getattr(contract, "restart_count", 0) or 0)


def exchange_positions(
    rank: int, world_size: int, line: str, wait: float = PEER_WAIT_SECONDS
) -> dict[int, str]:
    """Post this rank's position in the rendezvous store; collect the others' for up to ``wait`` s.

    Returns:
        Rank -> position line, for the ranks that posted one (this one always included).
    """
    positions = {rank: line}
    if world_size <= 1:
        return positions
    deadline = time.monotonic() + wait
    within(wait + STORE_GRACE_SECONDS, _exchange, positions, rank, world_size, line, deadline)
    return dict(positions)


def _exchange(
    positions: dict[int, str], rank: int, world_size: int, line: str, deadline: float
) -> None:
    """Post ``line``, then fill ``positions`` with the others' as they come, until ``deadline``."""
    try:
        from torch.distributed import distributed_c10d as c10d

        store: Any = c10d._get_default_store()
        attempt = _attempt()
        store.set(_KEY.format(attempt=attempt, rank=rank), line)
        while len(positions) < world_size:
            for other in range(world_size):
                key = _KEY.format(attempt=attempt, rank=other)
                if other not in positions and store.check([key]):
                    positions[other] = store.get(key).decode()
            if len(positions) == world_size or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        _wait_until_read(store, attempt, len(positions), deadline)
    except Exception:  # noqa: BLE001 - the store may be gone with a dead peer; report what we have
        pass


def within(seconds: float, function: Callable[..., Any], *args: Any) -> bool:
    """Run ``function(*args)`` in a daemon thread for at most ``seconds``; whether it finished.

    A store operation on a machine whose link is cut blocks until TCP gives up (many minutes),
    whatever the store's timeout: the report is made from what the function gathered so far.
    """
    worker = threading.Thread(target=function, args=args, name="accel-store-read", daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def _wait_until_read(store: Any, attempt: int, posted: int, deadline: float) -> None:
    """Count this rank as done reading; wait (to ``deadline``) for the other posters to be done.

    The rendezvous store lives in one of the processes (rank 0's, usually): a rank that read
    everything and exited at once would take the store with it before a slower peer had read
    this rank's position, and that peer would report it as silent.
    """
    key = _READ_KEY.format(attempt=attempt)
    done = store.add(key, 1)
    while done < posted and time.monotonic() < deadline:
        time.sleep(0.05)
        done = store.add(key, 0)
