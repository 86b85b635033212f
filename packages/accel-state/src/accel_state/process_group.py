"""Starting, adopting and stopping the default process group: the one piece of process-wide state.

A group started here is also stopped here when the interpreter exits normally. Python aborts a
process ("terminate called without an active exception") when a gloo worker thread still releases
a finished collective's tensors while the interpreter shuts down; destroying the group first joins
those threads while Python can still serve them.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import sys
import threading

import torch
import torch.distributed as dist

from accel_state.cluster.base import ProcessLayout
from accel_state.errors import ProcessGroupError

DEFAULT_TIMEOUT_SECONDS = 1800.0

_started_here = False  # whether the current default group was started (so is owned) here
_starting = threading.Event()  # set while this process waits in the default group's rendezvous


def group_start_in_progress() -> bool:
    """Whether this process is inside :func:`start_process_group`, waiting for its peers.

    A watchdog thread reads it: a peer that has left without joining can never arrive, so a
    process still waiting here would wait until the group timeout.
    """
    return _starting.is_set()


def resolve_timeout(
    timeout: datetime.timedelta | float | None, environment_seconds: float | None
) -> datetime.timedelta:
    """The process-group timeout: the argument, else ``ACCEL_PROCESS_GROUP_TIMEOUT``, else 30 min.

    Raises:
        ProcessGroupError: A non-positive timeout.

    """
    if timeout is None:
        timeout = (
            environment_seconds if environment_seconds is not None else DEFAULT_TIMEOUT_SECONDS
        )
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        raise ProcessGroupError(f"timeout={timeout} must be positive.")
    return timeout


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
        timeout: How long any collective may wait before failing.
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
        return False
    if backend == "xla":
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the backend)

        init_method = "xla://"
    elif layout.source == "torchelastic":
        init_method = "env://"
    else:
        init_method = f"tcp://{layout.master_addr}:{layout.master_port}"
    bound_device = device if device is not None and device.type == "cuda" else None
    _import_modules_that_capture_the_group()
    _starting.set()
    try:
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=layout.rank,
            world_size=layout.world_size,
            timeout=timeout,
            device_id=bound_device,
        )
    except Exception as error:
        raise ProcessGroupError(
            f"Could not start the {backend} process group as rank {layout.rank} of "
            f"{layout.world_size} via {init_method} (from the {layout.source} environment): {error}"
        ) from error
    finally:
        _starting.clear()
    global _started_here
    _started_here = True
    atexit.register(stop_at_exit)
    return True


def stop_process_group() -> None:
    """Destroy the default process group if one exists."""
    global _started_here
    _started_here = False
    atexit.unregister(stop_at_exit)
    if dist.is_available() and dist.is_initialized():
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
        return True
    if _started_here:
        stop_process_group()
        return True
    return False


def _import_modules_that_capture_the_group() -> None:
    """Import modules whose functions take ``group=group.WORLD`` as a default argument.

    Imported after the group starts (``torch._dynamo`` imports ``torch.distributed.nn``, and DDP
    imports dynamo), their defaults would hold the default group forever: destroying it would not
    free it, and its gloo threads would outlive the interpreter. Imported first, they hold None.
    """
    with contextlib.suppress(ImportError):  # a build without it has nothing to capture
        import torch.distributed.nn.functional  # noqa: F401
