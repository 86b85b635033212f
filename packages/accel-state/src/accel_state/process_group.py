"""Starting, adopting and stopping the default process group: the one piece of process-wide state.

Timeouts: a collective that waits longer than the *collective timeout* makes the process raise
instead of hanging. Given explicitly (``PartialState(timeout=...)``, ``InitProcessGroupKwargs``,
``ACCEL_PROCESS_GROUP_TIMEOUT`` or ``accel launch --collective_timeout``) it applies from the start.
Otherwise the group starts with :data:`STARTUP_TIMEOUT_SECONDS` (the first training step may
compile and warm up for minutes) and :func:`lower_timeouts` brings every group down to
:data:`DEFAULT_TIMEOUT_SECONDS` once that step is done, as torchtitan does. PyTorch's own defaults
are 30 minutes (gloo) and 10 minutes (NCCL).

Waiting for the other processes to arrive when a group starts is not a collective: a peer may
still be importing torch on a loaded machine, or its launcher may be re-forming an elastic round
(torch's agent then restarts this process). So that wait is at least
:data:`STARTUP_TIMEOUT_SECONDS` whatever the collective timeout; a peer that fails before it
arrives is its launcher's to report (the agents, and ``accel launch``'s machine board, end the
others at once).

A group started here is also stopped here when the interpreter exits normally. Python aborts a
process ("terminate called without an active exception") when a gloo worker thread still releases
a finished collective's tensors while the interpreter shuts down; destroying the group first joins
those threads while Python can still serve them.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import gc
import os
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, PrefixStore, Store
from torch.distributed.rendezvous import rendezvous

from accel_state.cluster.base import ProcessLayout
from accel_state.contract import flight_recorder_env
from accel_state.errors import ProcessGroupError
from accel_state.group_keeper import free_destroyed_groups, keep_groups
from accel_state.job_hosts import (
    machine_of,
    post_host,
    posted_hosts,
    ranks_by_host,
    wait_for_hosts,
)
from accel_state.network import choose_interface, local_address

#: The collective timeout once the first training step is done, unless one was given: 5 minutes.
DEFAULT_TIMEOUT_SECONDS = 300.0
#: The timeout until then (process-group start, compilation, the first step): 10 minutes.
STARTUP_TIMEOUT_SECONDS = 600.0

_started_here = False  # whether the current default group was started (so is owned) here
_starting = threading.Event()  # set while this process waits in the default group's rendezvous
# The rendezvous store of this process's default groups, kept for the life of the process (see
# _generation_store), keyed by the init method, rank and world size it was made for.
_rendezvous: dict[tuple[str, int, int], Store] = {}
_generation = 0  # how many default groups this process started over the tcp/env rendezvous
_job_store: Store | None = None  # the store of the running default group (see job_store)


def group_start_in_progress() -> bool:
    """Whether this process is inside :func:`start_process_group`, waiting for its peers.

    A watchdog thread reads it: a peer that has left without joining can never arrive, so a
    process still waiting here would wait until the group timeout.
    """
    return _starting.is_set()


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """How long collectives may wait: at start, and once the first training step is done.

    Attributes:
        startup: The timeout the process group starts with.
        collective: The timeout after the first step (:func:`lower_timeouts`).
        explicit: Whether the user chose it (then both are the same).
    """

    startup: datetime.timedelta
    collective: datetime.timedelta
    explicit: bool


def resolve_timeout(
    timeout: datetime.timedelta | float | None, environment_seconds: float | None
) -> Timeouts:
    """The timeouts: the argument, else ``ACCEL_PROCESS_GROUP_TIMEOUT``, else the defaults.

    Raises:
        ProcessGroupError: A non-positive timeout.

    """
    if timeout is None:
        timeout = environment_seconds
    if timeout is None:
        return Timeouts(
            datetime.timedelta(seconds=STARTUP_TIMEOUT_SECONDS),
            datetime.timedelta(seconds=DEFAULT_TIMEOUT_SECONDS),
            explicit=False,
        )
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        raise ProcessGroupError(
            f"timeout={timeout} must be positive; pass the seconds a collective may wait "
            "(e.g. timeout=300)."
        )
    return Timeouts(timeout, timeout, explicit=True)


def lower_timeouts(timeout: datetime.timedelta) -> int:
    """Set ``timeout`` on every process group of this process that waits longer.

    Call it on every process at the same point (after a barrier): a process that still waits
    under the long timeout is fine, one that lowers it early may time out on a slow peer.

    Returns:
        How many groups were changed.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    from torch.distributed import distributed_c10d as c10d

    changed = 0
    for group in list(c10d._world.pg_map):
        if group is None or c10d._rank_not_in_group(group):
            continue
        try:
            c10d._set_pg_timeout(timeout, group)
        except (ValueError, AssertionError, RuntimeError):
            continue  # a backend without settable timeouts (xla, mpi) keeps its own
        changed += 1
    return changed


def arrival_timeout(timeout: datetime.timedelta) -> datetime.timedelta:
    """How long a starting group waits for its processes to arrive.

    That is ``timeout``, and never less than :data:`STARTUP_TIMEOUT_SECONDS` (see the module
    docstring).
    """
    return max(timeout, datetime.timedelta(seconds=STARTUP_TIMEOUT_SECONDS))


def start_process_group(
    layout: ProcessLayout,
    backend: str,
    timeout: datetime.timedelta,
    device: torch.device | None = None,
) -> bool:
    """Start the default process group for ``layout``, or adopt one that already exists.

    Args:
        layout: Ranks and rendezvous address.
        backend: Communication backend (``gloo``, ``nccl``, ``xla``...).
        timeout: How long any collective may wait before failing (the wait for the other
            processes to arrive is :func:`arrival_timeout` of it).
        device: The process's device; a CUDA device is bound to the group eagerly.

    Returns:
        True when this call started the group (and so owns it), False when it adopted one.

    Raises:
        ProcessGroupError: torch.distributed is missing, the existing group disagrees with the
            layout, or the rendezvous fails.

    """
    if not dist.is_available():
        raise ProcessGroupError("This PyTorch build has no torch.distributed support.")
    if dist.is_initialized():
        if dist.get_world_size() != layout.world_size or dist.get_rank() != layout.rank:
            raise ProcessGroupError(
                f"A process group already exists with rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but the environment says rank {layout.rank} of "
                f"{layout.world_size}; start the group with the launcher's values."
            )
        keep_groups()
        return False
    if backend == "xla":
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the backend)

        init_method = "xla://"
    elif layout.source == "torchelastic":
        init_method = "env://"
    else:
        init_method = f"tcp://{layout.master_addr}:{layout.master_port}"
    bound_device = device if device is not None and device.type == "cuda" else None
    if backend == "nccl":
        # torch's Flight Recorder records NCCL collectives and dumps them on a timeout; its
        # variables are read when the group starts. A user's own settings win.
        for name, value in flight_recorder_env().items():
            os.environ.setdefault(name, value)
    if backend != "xla":
        _choose_interface(layout)
    arrival = arrival_timeout(timeout)
    free_destroyed_groups()
    _import_modules_that_capture_the_group()
    _starting.set()
    global _job_store
    store: Store | None = None
    try:
        if backend == "xla":
            rendezvous_args: dict[str, Any] = {"init_method": init_method}
        else:
            store = _generation_store(init_method, layout, arrival)
            post_host(store, layout.rank, local_address(layout.master_addr, os.environ))
            # Every process is there before the backend's own exchange, which waits only the
            # collective timeout for each peer.
            wait_for_hosts(store, layout.world_size, arrival)
            rendezvous_args = {"store": store}
        dist.init_process_group(
            backend=backend,
            rank=layout.rank,
            world_size=layout.world_size,
            timeout=timeout,
            device_id=bound_device,
            **rendezvous_args,
        )
    except Exception as error:
        raise ProcessGroupError(
            f"Could not start the {backend} process group as rank {layout.rank} of "
            f"{layout.world_size} via {init_method} (from the {layout.source} environment): "
            f"{error}{_missing_ranks(store, layout, arrival)}"
        ) from error
    finally:
        _starting.clear()
    if store is not None:
        store.set_timeout(timeout)  # from now on the store serves the job's collectives
    _job_store = store
    global _started_here
    _started_here = True
    keep_groups()
    atexit.register(stop_at_exit)
    return True


def job_store() -> Store | None:
    """The rendezvous store of the default group started here (None: none, or an adopted one).

    Every process of the job reaches it; :mod:`accel_state.job_hosts` reads where ranks run.
    """
    return _job_store if dist.is_available() and dist.is_initialized() else None


def _choose_interface(layout: ProcessLayout) -> None:
    """Set the backends' interface variables to the one that routes to the main machine.

    Only when the user set none of them and the main machine is not reached over loopback; said
    once per machine (by local rank 0). ``accel launch`` sets them for its workers already.
    """
    choice = choose_interface(layout.master_addr, os.environ)
    if choice is None:
        return
    os.environ.update(choice.env())
    if layout.local_rank == 0:
        names = "/".join(choice.env())
        print(
            f"accel: {names}={choice.interface}: {choice.describe()} (set GLOO_SOCKET_IFNAME "
            "or NCCL_SOCKET_IFNAME to choose another)",
            file=sys.stderr,
            flush=True,
        )


def _missing_ranks(store: Store | None, layout: ProcessLayout, timeout: datetime.timedelta) -> str:
    """``; ranks 2, 3 (machine 1) never arrived ...`` after a failed start, from the posted hosts."""
    if store is None or layout.world_size <= 1:
        return ""
    everyone = range(layout.world_size)
    posted = posted_hosts(store, everyone)
    if not posted:
        return ""
    missing = [rank for rank in everyone if rank not in posted]
    if not missing:
        return ""
    machines = sorted({machine_of(rank, layout.local_world_size) for rank in missing})
    arrived = ranks_by_host(posted, posted)
    return (
        f"\nRanks {', '.join(map(str, missing))} (machine "
        f"{', '.join(map(str, machines))} at {layout.local_world_size} process(es) per machine) "
        f"never arrived at the rendezvous {layout.master_addr}:{layout.master_port} within "
        f"{timeout.total_seconds():g} s; arrived: {arrived}. Read the missing machines' own "
        "output for their error; check that they were started with the same --num_machines, "
        "--main_process_ip and --main_process_port, and that the port is open between the "
        "machines."
    )


def _generation_store(
    init_method: str, layout: ProcessLayout, timeout: datetime.timedelta
) -> Store:
    """The rendezvous store for the next default group: one store per process, a fresh prefix.

    A process may start a group, destroy it and start another (``reset_state()`` then a new
    Accelerator). Rendezvousing afresh on the same address each time hangs whenever something
    still holds the old group (a prepared DDP model does): rank 0's old store keeps serving the
    port, torch reuses it, and the new group reads the old group's keys. So the store made by
    the first rendezvous lives as long as the process, and each group starts under its own
    prefix, which every process counts the same way.
    """
    global _generation
    key = (init_method, layout.rank, layout.world_size)
    store = _rendezvous.get(key)
    if store is None:
        store, _, _ = next(
            rendezvous(init_method, rank=layout.rank, world_size=layout.world_size, timeout=timeout)
        )
        _rendezvous.clear()
        _rendezvous[key] = store
    store.set_timeout(timeout)
    _generation += 1
    return PrefixStore(f"accel_default_group_{_generation}/", store)


def start_single_process_group(
    backend: str, timeout: datetime.timedelta, device: torch.device | None = None
) -> None:
    """Start a default group of this one process on an in-memory store (no port, no rendezvous).

    For a one-process job that needs a group all the same (FSDP, a sharded checkpoint resumed on
    one process) but was not started by a launcher. The group is owned here: ``reset_state()``
    and the exit hook stop it.

    Raises:
        ProcessGroupError: torch.distributed is missing, a group already exists, or it fails to start.
    """
    global _started_here
    if not dist.is_available():
        raise ProcessGroupError("This PyTorch build has no torch.distributed support.")
    if dist.is_initialized():
        raise ProcessGroupError(
            "start_single_process_group(): a default process group already exists "
            f"(rank {dist.get_rank()} of {dist.get_world_size()}); use it instead."
        )
    bound_device = device if device is not None and device.type == "cuda" else None
    free_destroyed_groups()
    _import_modules_that_capture_the_group()
    try:
        dist.init_process_group(
            backend=backend,
            store=HashStore(),
            rank=0,
            world_size=1,
            timeout=timeout,
            device_id=bound_device,
        )
    except Exception as error:
        raise ProcessGroupError(
            f"Could not start a one-process {backend} process group: {error}"
        ) from error
    _started_here = True
    keep_groups()
    atexit.register(stop_at_exit)


def stop_process_group() -> None:
    """Destroy the default process group if one exists.

    Its groups stay kept (:mod:`accel_state.group_keeper`) until the next group starts or the
    interpreter exits, so wrappers freed afterwards never drop their last reference.
    """
    global _started_here, _job_store
    _started_here = False
    _job_store = None
    atexit.unregister(stop_at_exit)
    if dist.is_available() and dist.is_initialized():
        keep_groups()
        dist.destroy_process_group()


def stop_at_exit() -> bool:
    """What a normal interpreter exit does: destroy the group accel-state started, if any.

    Registered with :mod:`atexit` when the group starts; wrappers that hold the group (DDP) call it
    from their own exit hooks before letting go of it. After an uncaught exception the group is
    left alone: destroying it waits for this process's pending collectives, which may never
    finish, while exiting at once lets the launcher stop the other processes.

    Returns:
        True when no default group is left, so objects still holding the old one may drop it.

    """
    if getattr(sys, "last_value", None) is not None:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        _rendezvous.clear()  # the kept store too: freed at interpreter teardown it can abort
        return True
    if _started_here:
        stop_process_group()
        _rendezvous.clear()
        return True
    return False


def forget_rendezvous() -> None:
    """Drop the kept rendezvous store and restart the group count (no group may be running).

    For a process that runs one job after another with new peers on a new address each time
    (a pooled test worker): the next group then rendezvouses afresh, and every process of the
    new job counts its groups from the same start.

    Raises:
        ProcessGroupError: A default process group is still running.

    """
    global _generation
    if dist.is_available() and dist.is_initialized():
        raise ProcessGroupError(
            "forget_rendezvous() was called while a default process group is running; "
            "destroy it first (reset_state() or torch.distributed.destroy_process_group())."
        )
    _rendezvous.clear()
    _generation = 0


def release_group_references(*roots: object) -> int:
    """Drop every reference to a process group reachable from ``roots`` (call at exit only).

    A destroyed group lives on while any object holds it, and so do its gloo worker threads;
    freed during interpreter shutdown instead, such a group can abort the process ("terminate
    called without an active exception"). FSDP2 modules hold their groups in places no public
    API releases (their mesh info, and the ``DeviceMesh`` of every ``DTensor`` parameter and
    optimizer state), so this walks the objects reachable from ``roots`` (not through functions,
    classes or modules) and replaces each group found in an attribute or a dict by ``None``.
    The objects cannot run collectives afterwards.

    Returns:
        How many references were dropped.
    """
    skipped = (type, type(sys), type(release_group_references), type(len), str, bytes, int, float)
    seen: set[int] = set()
    pending = list(roots)
    dropped = 0
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, skipped):
            continue
        seen.add(id(obj))
        mappings = [obj] if isinstance(obj, dict) else []
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            mappings.append(attributes)
        for mapping in mappings:
            for key, value in list(mapping.items()):
                if isinstance(value, dist.ProcessGroup):
                    mapping[key] = None
                    dropped += 1
        pending.extend(gc.get_referents(obj))
    return dropped


def _import_modules_that_capture_the_group() -> None:
    """Import modules whose functions take ``group=group.WORLD`` as a default argument.

    Imported after the group starts (``torch._dynamo`` imports ``torch.distributed.nn``, and DDP
    imports dynamo), their defaults would hold the default group forever: destroying it would not
    free it, and its gloo threads would outlive the interpreter. Imported first, they hold None.
    """
    with contextlib.suppress(ImportError):  # a build without it has nothing to capture
        import torch.distributed.nn.functional  # noqa: F401
