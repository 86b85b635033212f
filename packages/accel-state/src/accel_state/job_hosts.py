"""Where each rank runs, posted in the rendezvous store: to name the ranks and hosts that are missing.

Every process posts ``hostname address`` under its rank before the process group starts. When the
start times out, the ranks that never posted are the ones that never arrived; when a collective
times out, the ranks that stay silent are named with their host, so that a lost machine reads as
``ranks 2, 3 on node1 (198.18.0.11)`` rather than as a bare timeout. Reads never block: a key
not there yet is reported as unknown.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
from collections.abc import Iterable
from typing import Any

_KEY = "accel/hosts/{rank}"


def post_host(store: Any, rank: int, address: str | None) -> None:
    """Post this process's hostname and address under ``rank`` (errors are ignored)."""
    with contextlib.suppress(Exception):
        store.set(_KEY.format(rank=rank), f"{socket.gethostname()} {address or '?'}")


def wait_for_hosts(store: Any, world_size: int, timeout: datetime.timedelta) -> None:
    """Wait until every rank of ``world_size`` posted its host (they have all arrived).

    Raises:
        Exception: The store's own error when ``timeout`` passes first (or the store is gone).
    """
    if world_size > 1:
        store.wait([_KEY.format(rank=rank) for rank in range(world_size)], timeout)


def posted_hosts(store: Any, ranks: Iterable[int]) -> dict[int, str]:
    """Rank -> ``hostname address`` for those of ``ranks`` that posted (never blocks)."""
    found: dict[int, str] = {}
    for rank in ranks:
        key = _KEY.format(rank=rank)
        try:
            if store.check([key]):
                found[rank] = store.get(key).decode()
        except Exception:  # noqa: BLE001 - the store may be gone with its host
            break
    return found


def describe_host(posted: str) -> str:
    """``node1 (198.18.0.11)`` from a posted ``node1 198.18.0.11``."""
    hostname, _, address = posted.partition(" ")
    return f"{hostname} ({address})" if address and address != "?" else hostname


def ranks_by_host(ranks: Iterable[int], hosts: dict[int, str]) -> str:
    """``ranks 2, 3 on node1 (198.18.0.11); rank 5 on an unknown host`` for ``ranks``."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        where = describe_host(hosts[rank]) if rank in hosts else "an unknown host"
        groups.setdefault(where, []).append(rank)
    parts = []
    for where, members in groups.items():
        label = "rank" if len(members) == 1 else "ranks"
        parts.append(f"{label} {', '.join(map(str, members))} on {where}")
    return "; ".join(parts)


def machine_of(rank: int, local_world_size: int) -> int:
    """The machine index of ``rank`` when every machine runs ``local_world_size`` processes."""
    return rank // max(1, local_world_size)
