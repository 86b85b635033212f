"""Keeping process groups alive until they can be freed safely.

A gloo collective started during ``backward`` (every DDP and FSDP gradient reduction) carries a
snapshot of the thread's state, and that snapshot holds a Python object (the ``contextvars``
context that ``torch.autograd.graph._engine_run_backward`` stashes in thread-local state, torch
2.13). The gloo worker thread that ran the collective frees it afterwards, and freeing that object
needs the GIL. If the group's last reference is dropped by a C++ holder that keeps the GIL while
it is freed (DDP's ``Reducer``, freed with its wrapper when a script's function returns after
``destroy_process_group()``), the group's destructor joins that worker thread while the worker
waits for the GIL: the process hangs, or, during interpreter shutdown, aborts ("terminate called
without an active exception").

So this module holds its own reference to every group it is shown (:func:`keep_groups`), and no
other holder can drop the last one. Kept groups are freed only by :func:`free_destroyed_groups`,
when no default group is running: it first has every :class:`GroupHolders` drop its objects'
references, then drops its own through the Python group object, whose destructor releases the
GIL before the C++ one joins the worker threads. That happens before the next group starts and at
a normal interpreter exit, long after the group's last collective. On torch older than 2.9 the
Python object holds the GIL too (``accel_state.torch_compat.group_free_releases_gil``): there a
kept group is never freed, and its threads end with the process.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from accel_state.torch_compat import group_free_releases_gil, keep_forever

# Each kept group by id: the Python objects, so dropping them releases the GIL first.
_KEPT: dict[int, dist.ProcessGroup] = {}
# Every GroupHolders that has held an object: each drops its groups before kept ones are freed.
_HOLDERS: list[GroupHolders] = []


def keep_groups() -> int:
    """Hold a reference to every process group torch currently knows (default and subgroups).

    Call it wherever groups may have been made: after a group starts, after models are wrapped
    (meshes make subgroups) and before a group is destroyed.

    Returns:
        How many groups are kept now.
    """
    if not dist.is_available() or not dist.is_initialized():
        return len(_KEPT)
    from torch.distributed import distributed_c10d as c10d

    for group in list(c10d._world.pg_map):
        if isinstance(group, dist.ProcessGroup):
            _KEPT.setdefault(id(group), group)
    return len(_KEPT)


def kept_group_count() -> int:
    """How many groups are kept (running or destroyed), for tests and diagnostics."""
    return len(_KEPT)


class GroupHolders:
    """Live objects of one kind that hold process groups (DDP wrappers, sharded models, meshes).

    :meth:`add` remembers an object (weakly) and keeps every group that exists now; before kept
    groups are freed, ``release`` is called with the live objects to drop their references.

    Args:
        release: Drops the process groups held by the objects it is given.
    """

    def __init__(self, release: Callable[[list[Any]], object]) -> None:
        self._holders: weakref.WeakSet[Any] = weakref.WeakSet()
        self._release = release

    def add(self, holder: Any) -> None:
        """Remember ``holder`` and keep the groups it may use."""
        self._holders.add(holder)
        if self not in _HOLDERS:
            _HOLDERS.append(self)
        keep_groups()

    def release(self) -> None:
        """Have the live holders drop their groups (they cannot run collectives afterwards)."""
        self._release(list(self._holders))

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._holders))


def free_destroyed_groups() -> int:
    """Free the kept groups once no default group is running (does nothing while one is).

    Returns:
        How many kept groups were let go.
    """
    if not dist.is_available() or dist.is_initialized() or not _KEPT:
        return 0
    for holders in list(_HOLDERS):
        holders.release()
    count = len(_KEPT)
    safe = group_free_releases_gil()
    while _KEPT:
        _, group = _KEPT.popitem()
        if not safe:  # torch < 2.9 would join the worker threads holding the GIL: never free
            keep_forever(group)
        # Otherwise the last reference, dropped here: the holder releases the GIL, then joins.
        del group
    return count


# Registered at import, before any group starts: atexit runs it after stop_at_exit (registered
# when a group starts), so the group accel-state owns is destroyed by then.
atexit.register(free_destroyed_groups)
