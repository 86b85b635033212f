"""The default process group as seen by accel-ops: world size, rank and backend, nothing else.

accel-ops never starts a process group. When ``torch.distributed`` has a default group with more
than one process (started by ``accel_state.PartialState``, ``torchrun`` or any library), the
collectives use it; otherwise they behave as a single process.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch
import torch.distributed as dist

from accel_ops.errors import InvalidArgumentError

# The group is held weakly: a strong reference here would keep a destroyed group (and its gloo
# worker threads) alive until interpreter shutdown, where a thread that still needs the GIL aborts.
_cached: tuple[weakref.ref[Any], GroupInfo] | None = None


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What the collectives need to know about the default process group.

    Attributes:
        world_size: Number of processes.
        rank: This process's index.
        backend: Backend name as ``torch.distributed.get_backend()`` gives it.
        is_xla: Whether the group runs on torch_xla's ``xla`` backend.
        list_gather_only: Whether the backend only has the list form of ``all_gather`` (gloo, MPI).
        process_group: The ``torch.distributed`` group the collectives run on; ``None`` is the
            default group.

    """

    world_size: int
    rank: int
    backend: str
    process_group: Any = dataclasses.field(default=None, compare=False, repr=False)
    is_xla: bool = dataclasses.field(init=False)
    list_gather_only: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_xla", self.backend == "xla")
        object.__setattr__(self, "list_gather_only", self.backend in ("gloo", "mpi"))


def current_group() -> GroupInfo | None:
    """The default process group, or None when there is none or it holds a single process."""
    global _cached
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.group.WORLD
    cached = _cached
    if cached is None or cached[0]() is not world:
        info = GroupInfo(dist.get_world_size(), dist.get_rank(), str(dist.get_backend()))
        cached = _cached = (weakref.ref(world), info)
    return cached[1] if cached[1].world_size > 1 else None


def describe_group(process_group: Any) -> GroupInfo:
    """A :class:`GroupInfo` for an explicit group, such as one made by ``dist.new_group``.

    The group is held only for the duration of the collective that uses the returned object;
    do not cache the result past ``destroy_process_group``.
    """
    return GroupInfo(
        dist.get_world_size(process_group),
        dist.get_rank(process_group),
        str(dist.get_backend(process_group)),
        process_group,
    )


def default_device(group: GroupInfo) -> torch.device:
    """The device a process allocates receiving buffers on when it has no tensor to copy from."""
    if group.is_xla:
        from accel_ops import xla

        return xla.device()
    if "nccl" in group.backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_source(operation: str, from_process: int, group: GroupInfo | None) -> None:
    """Raise unless ``from_process`` is a rank of the job.

    Raises:
        InvalidArgumentError: ``from_process`` is not an int in ``[0, world_size)``.

    """
    world_size = 1 if group is None else group.world_size
    if isinstance(from_process, bool) or not isinstance(from_process, int):
        raise InvalidArgumentError(
            f"{operation}(from_process={from_process!r}) must be a process index (an int)."
        )
    if not 0 <= from_process < world_size:
        raise InvalidArgumentError(
            f"{operation}(from_process={from_process}) is not a process of this "
            f"{world_size}-process job; use a rank from 0 to {world_size - 1}."
        )
