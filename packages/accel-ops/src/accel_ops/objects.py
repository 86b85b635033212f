"""Collectives over picklable Python objects: gather_object and broadcast_object_list."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from accel_ops.errors import UnsupportedTypeError
from accel_ops.group import check_source, current_group, describe_group
from accel_ops.records import recorded
from accel_ops.transport import all_gather_objects, broadcast_objects


@recorded("gather_object")
def gather_object(object: Any, *, process_group: Any = None) -> Any:
    """Gather a list from every process into one list, ordered by rank.

    Each process passes a list (or tuple) of picklable objects; the result is their
    concatenation, the same on every process. The lists may differ in length. A tensor counts
    as the list of its rows (``gather_for_metrics(tensor, use_gather_object=True)``), as in
    Accelerate.

    Args:
        object: This process's list of objects, or a tensor of at least one dimension.
        process_group: A ``torch.distributed`` group to gather over; ``None``: every process.

    Returns:
        The concatenated list. A single process gets ``object`` back unchanged.

    Raises:
        UnsupportedTypeError: On every process, when some process passed something other than a
            list, tuple or tensor (wrap a single object: ``gather_object([object])``).

    """
    group = current_group() if process_group is None else describe_group(process_group)
    if group is None or group.world_size == 1:
        return object
    parts = all_gather_objects(object, group)
    wrong = [rank for rank, part in enumerate(parts) if not is_gatherable_sequence(part)]
    if wrong:
        listed = "; ".join(
            f"process {rank} passed a {type(parts[rank]).__name__}" for rank in wrong
        )
        raise UnsupportedTypeError(
            "gather_object",
            type(parts[wrong[0]]),
            "a list, tuple or tensor (its rows) on every process, which it concatenates",
            f"({listed}). Wrap a single object in a list: gather_object([obj]).",
        )
    return [item for part in parts for item in part]


def is_gatherable_sequence(part: Any) -> bool:
    """Whether ``gather_object`` concatenates ``part``: a list, a tuple or a tensor's rows."""
    return isinstance(part, (list, tuple)) or (isinstance(part, torch.Tensor) and part.dim() > 0)


@recorded("gather_objects_by_rank")
def gather_objects_by_rank(obj: Any, process_group: Any = None) -> list[Any]:
    """Every process's picklable ``obj``, as a list indexed by rank, on every process.

    Unlike ``torch.distributed.all_gather_object`` this needs no numpy: the objects travel as
    pickled bytes in uint8 tensors.

    Args:
        obj: This process's object.
        process_group: A ``torch.distributed`` group to gather over (e.g. from ``new_group``);
            ``None`` uses the default group.

    Returns:
        ``[obj]`` when there is no group or it holds a single process.

    """
    if process_group is None:
        group = current_group()
    elif dist.is_available() and dist.is_initialized():
        group = describe_group(process_group)
    else:
        group = None
    if group is None or group.world_size == 1:
        return [obj]
    return all_gather_objects(obj, group)


@recorded("broadcast_object_list")
def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of ``object_list`` with those of process ``from_process``, in place.

    Receivers may pass lists of any length (e.g. ``[None]``); they end up with the source's
    items. Objects travel pickled, so they must be picklable on the source.

    Args:
        object_list: The list to fill.
        from_process: Rank whose items every process receives.

    Returns:
        ``object_list`` itself, now holding the source's items.

    Raises:
        UnsupportedTypeError: ``object_list`` is not a list.
        InvalidArgumentError: ``from_process`` is not a rank of the job.

    """
    if not isinstance(object_list, list):
        raise UnsupportedTypeError(
            "broadcast_object_list",
            type(object_list),
            "a list, which it fills in place",
            "Pass a list, e.g. broadcast_object_list([value]) and read item 0.",
        )
    group = current_group()
    check_source("broadcast_object_list", from_process, group)
    if group is not None:
        object_list[:] = broadcast_objects(object_list, group, from_process)
    return object_list
