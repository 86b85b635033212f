"""Tensor collectives over nested structures: gather, broadcast, reduce, copy to every process.

Each function uses the default ``torch.distributed`` process group when one with several processes
exists, and behaves as a single process otherwise. Leaves must be tensors.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist

from accel_ops import xla
from accel_ops.debug import check_operands
from accel_ops.errors import DistributedOperationError, InvalidArgumentError
from accel_ops.group import (
    GroupInfo,
    check_source,
    current_group,
    default_device,
    describe_group,
)
from accel_ops.records import recorded
from accel_ops.structures import (
    apply_to_tensors,
    get_data_structure,
    initialize_tensors,
    recursively_apply,
)
from accel_ops.transport import all_gather_objects, broadcast_tensor, gather_tensor

Reduction = Literal["mean", "sum", "max", "none"]
REDUCTIONS = ("mean", "sum", "max", "none")

_GATHER_HINT = (
    "Only tensors can be gathered; use gather_object for Python objects, or convert the value "
    "to a tensor."
)
_GATHER_FIX = (
    "every process must pass the same structure with tensors of the same shape and dtype; pad "
    "ragged tensors first with pad_across_processes(data, dim=0)."
)


@recorded("gather")
def gather(tensor: Any, *, debug: bool | None = None, process_group: Any = None) -> Any:
    """Gather tensors from every process, concatenated along dimension 0.

    0-d tensors become 1-d (one value per process). Every process must pass the same structure
    with tensors of the same shape; pad ragged ones first with :func:`pad_across_processes`.

    Args:
        tensor: A tensor or nested list/tuple/namedtuple/Mapping/dataclass of tensors.
        debug: Check shapes across processes first (default: the debug-mode setting).
        process_group: A ``torch.distributed`` group to gather over (e.g. a mesh dimension's);
            ``None`` gathers over every process.

    Returns:
        The same structure; each tensor has ``world_size`` times as many rows. A single process
        gets ``tensor`` back unchanged.

    Raises:
        UnsupportedTypeError: A leaf is not a tensor.
        DistributedOperationError: Debug mode found operands that differ across processes.

    """
    group = _group(process_group)
    if group is None:
        return tensor
    check_operands("accel_ops.gather", tensor, group, debug, hint=_GATHER_FIX)
    if isinstance(tensor, torch.Tensor):
        return gather_tensor(tensor, group)
    return apply_to_tensors("gather", _GATHER_HINT, gather_tensor, tensor, group)


def _group(process_group: Any) -> GroupInfo | None:
    """The default group, or ``process_group`` described; ``None`` for a single process."""
    if process_group is None:
        return current_group()
    group = describe_group(process_group)
    return group if group.world_size > 1 else None


@recorded("broadcast")
def broadcast(tensor: Any, from_process: int = 0, *, debug: bool | None = None) -> Any:
    """Overwrite every tensor in ``tensor`` (or nested in it) with the one held by process ``from_process``.

    Tensors are written in place (and returned in the same structure), so every process must
    pass tensors of the source's shapes and dtypes. Use :func:`copy_tensor_to_devices` when
    the receivers cannot know them.

    Args:
        tensor: A tensor or nested structure of tensors.
        from_process: Rank whose values every process receives.
        debug: Check shapes across processes first (default: the debug-mode setting).

    Raises:
        InvalidArgumentError: ``from_process`` is not a rank of the job.
        UnsupportedTypeError: A leaf is not a tensor.
        DistributedOperationError: Debug mode found operands that differ across processes.

    """
    group = current_group()
    check_source("broadcast", from_process, group)
    if group is None:
        return tensor
    check_operands(
        "accel_ops.broadcast",
        tensor,
        group,
        debug,
        hint="receivers must pass tensors of the source's shapes and dtypes; use "
        "copy_tensor_to_devices or broadcast_object_list when they cannot know them.",
    )
    return apply_to_tensors(
        "broadcast",
        "Only tensors can be broadcast; use broadcast_object_list for Python objects.",
        broadcast_tensor,
        tensor,
        group,
        from_process,
    )


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _reduce_tensor(
    tensor: torch.Tensor, group: GroupInfo | None, reduction: str, scale: float
) -> torch.Tensor:
    if (reduction == "mean" or scale != 1) and not (
        tensor.is_floating_point() or tensor.is_complex()
    ):
        raise InvalidArgumentError(
            f"reduce(reduction={reduction!r}, scale={scale!r}) needs floating-point tensors, "
            f"got a {str(tensor.dtype).removeprefix('torch.')} tensor of shape "
            f"{list(tensor.shape)}; use reduction='sum' or 'max' with scale=1.0, or convert "
            "it with tensor.float()."
        )
    if group is None or reduction == "none":
        return tensor.clone() if scale == 1 else tensor * scale
    if group.is_xla:
        factor = scale / group.world_size if reduction == "mean" else scale
        return xla.all_reduce(tensor.clone(), reduction, factor)
    if tensor.is_contiguous():
        result = tensor.clone()
    else:
        result = tensor.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(result, op=_REDUCE_OPS[reduction])
    if reduction == "mean":
        result.div_(group.world_size)
    if scale != 1:
        result.mul_(scale)
    return result


@recorded("reduce")
def reduce(
    tensor: Any, reduction: Reduction = "mean", scale: float = 1.0, *, debug: bool | None = None
) -> Any:
    """Reduce ``tensor`` (or every tensor nested in it) across processes; the inputs are not modified.

    Args:
        tensor: A tensor or nested structure of tensors (same shapes on every process).
        reduction: ``"mean"``, ``"sum"``, ``"max"``, or ``"none"`` (no communication: a copy).
        scale: Factor applied to the result.
        debug: Check shapes across processes first (default: the debug-mode setting).

    Returns:
        New tensors in the same structure. A single process gets ``tensor * scale`` (copies).

    Raises:
        InvalidArgumentError: Unknown ``reduction``, or ``mean``/``scale`` on integer tensors.
        UnsupportedTypeError: A leaf is not a tensor.
        DistributedOperationError: Debug mode found operands that differ across processes.

    """
    if reduction not in REDUCTIONS:
        raise InvalidArgumentError(
            f"reduce(reduction={reduction!r}) is not supported; use one of {', '.join(REDUCTIONS)}."
        )
    group = current_group()
    if group is not None and reduction != "none":
        check_operands(
            "accel_ops.reduce",
            tensor,
            group,
            debug,
            hint="every process must reduce tensors of the same shapes and dtypes.",
        )
    if isinstance(tensor, torch.Tensor):
        return _reduce_tensor(tensor, group, reduction, scale)
    return apply_to_tensors(
        "reduce",
        "Only tensors can be reduced; convert numbers with torch.tensor(value).",
        _reduce_tensor,
        tensor,
        group,
        reduction,
        scale,
    )


@recorded("copy_tensor_to_devices")
def copy_tensor_to_devices(tensor: Any = None) -> Any:
    """Copy tensors held by exactly one process to every process; the others pass None.

    Unlike :func:`broadcast`, receivers need not know the shapes: the holder's structure, shapes
    and dtypes are exchanged first. Receivers allocate on their default device (the current CUDA
    device under NCCL, the XLA device under XLA, else the CPU).

    Args:
        tensor: The tensor or nested structure of tensors on one process, None on the others.

    Returns:
        The holder's tensors, on every process.

    Raises:
        DistributedOperationError: No process, or more than one, passed tensors.

    """
    group = current_group()
    if group is None:
        return tensor
    structure = None if tensor is None else get_data_structure(tensor)
    structures = all_gather_objects(structure, group)
    holders = [rank for rank, held in enumerate(structures) if held is not None]
    if len(holders) != 1:
        raise DistributedOperationError(
            f"accel_ops.copy_tensor_to_devices: exactly one process must pass tensors (the others "
            f"None), but {len(holders)} did (processes {holders}). Fix: pass None on every "
            "process but one, or use broadcast(tensor, from_process=...) when all hold tensors.",
            "accel_ops.copy_tensor_to_devices",
            [repr(held) for held in structures],
        )
    source = holders[0]
    if tensor is None:
        tensor = initialize_tensors(structures[source], device=default_device(group))
    return recursively_apply(broadcast_tensor, tensor, group, source, error_on_other_type=True)
