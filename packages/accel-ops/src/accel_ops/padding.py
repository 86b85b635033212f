"""Padding: make ragged tensors the same size across processes, or divisible by their number."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch

from accel_ops.debug import check_operands, rank_key
from accel_ops.errors import (
    CannotPadNestedTensorWarning,
    InvalidArgumentError,
    UnsupportedTypeError,
)
from accel_ops.group import current_group
from accel_ops.records import recorded
from accel_ops.structures import apply_to_tensors, named_leaves
from accel_ops.transport import gather_tensor


def _check_int(operation: str, name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{operation}({name}={value!r}) must be an int.")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{operation}({name}={value}) must be >= {minimum}.")
    return value


def _tensor_leaves(operation: str, data: Any) -> list[torch.Tensor]:
    leaves = []
    for path, leaf in named_leaves(data):
        if not isinstance(leaf, torch.Tensor):
            raise UnsupportedTypeError(
                operation,
                type(leaf),
                "tensors nested in list/tuple/namedtuple/Mapping/dataclass containers",
                "Only tensors can be padded; keep other values out of the structure.",
                path=[path],
            )
        leaves.append(leaf)
    return leaves


def _size_along(tensor: torch.Tensor, dim: int) -> int:
    """``tensor.shape[dim]``, or -1 when ``dim`` is out of range or the tensor is nested."""
    if getattr(tensor, "is_nested", False) or not -tensor.ndim <= dim < tensor.ndim:
        return -1
    return int(tensor.shape[dim])


@recorded("pad_across_processes")
def pad_across_processes(
    tensor: Any,
    dim: int = 0,
    pad_index: int | float | bool = 0,
    pad_first: bool = False,
    *,
    debug: bool | None = None,
) -> Any:
    """Pad every tensor along ``dim`` to the largest size any process has there.

    One collective exchanges the sizes of all the tensors in ``tensor``; tensors that are already
    the largest, or have no dimension ``dim``, are returned as they are.

    Args:
        tensor: A tensor or nested structure of tensors, with the same structure and number of
            dimensions on every process.
        dim: The dimension to pad (negative values count from the end).
        pad_index: The value to pad with.
        pad_first: Pad at the start instead of the end.
        debug: Check structures across processes first (default: the debug-mode setting).

    Returns:
        The same structure with padded tensors (dtypes are kept). A single process gets ``tensor``.

    Raises:
        InvalidArgumentError: ``dim`` is not an int.
        UnsupportedTypeError: A leaf is not a tensor.
        DistributedOperationError: Debug mode found structures that differ across processes.

    """
    _check_int("pad_across_processes", "dim", dim)
    leaves = _tensor_leaves("pad_across_processes", tensor)
    for leaf in leaves:
        if getattr(leaf, "is_nested", False):
            warnings.warn(
                "pad_across_processes cannot pad nested tensors; they are returned as they are.",
                CannotPadNestedTensorWarning,
                stacklevel=3,  # past the recording wrapper
            )
            break
    group = current_group()
    if group is None or not leaves:
        return tensor
    check_operands(
        "accel_ops.pad_across_processes",
        tensor,
        group,
        debug,
        key=rank_key,
        hint="every process must pass the same structure with the same number of dimensions.",
    )
    local = torch.tensor(
        [_size_along(leaf, dim) for leaf in leaves], dtype=torch.int64, device=leaves[0].device
    )
    largest = gather_tensor(local, group).view(group.world_size, -1).amax(dim=0).tolist()
    return apply_to_tensors(
        "pad_across_processes", "", _pad_to, tensor, iter(largest), dim, pad_index, pad_first
    )


def _pad_to(
    tensor: torch.Tensor,
    targets: Iterator[int],
    dim: int,
    pad_index: int | float | bool,
    pad_first: bool,
) -> torch.Tensor:
    target = next(targets)
    if target < 0 or _size_along(tensor, dim) in (-1, target):
        return tensor
    return _pad_along(tensor, dim % tensor.ndim, target, pad_index, pad_first)


def _pad_along(
    tensor: torch.Tensor, dim: int, size: int, value: int | float | bool, pad_first: bool
) -> torch.Tensor:
    shape = list(tensor.shape)
    old = shape[dim]
    shape[dim] = size
    padded = tensor.new_full(shape, value)
    start = size - old if pad_first else 0
    padded.narrow(dim, start, old).copy_(tensor)
    return padded


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad tensors along ``dim`` so that ``batch_size`` splits evenly over ``num_processes``.

    The new size is the smallest multiple of ``num_processes`` that is at least ``batch_size``
    (and at least ``num_processes``, so every process gets one row); the added rows are zeros.
    No communication.

    Args:
        tensor: A tensor or nested structure of tensors whose size along ``dim`` is
            ``batch_size``.
        batch_size: The current size along ``dim``.
        num_processes: How many processes will share the batch.
        dim: The batch dimension.

    Raises:
        InvalidArgumentError: A size argument is not a positive int, or a tensor is larger than
            the padded size.
        UnsupportedTypeError: A leaf is not a tensor.

    """
    _check_int("pad_input_tensors", "batch_size", batch_size, minimum=0)
    _check_int("pad_input_tensors", "num_processes", num_processes, minimum=1)
    _check_int("pad_input_tensors", "dim", dim)
    target = max(num_processes, -(-batch_size // num_processes) * num_processes)
    return apply_to_tensors("pad_input_tensors", "", _pad_input, tensor, dim, target, batch_size)


def _pad_input(tensor: torch.Tensor, dim: int, target: int, batch_size: int) -> torch.Tensor:
    if not -tensor.ndim <= dim < tensor.ndim:
        raise InvalidArgumentError(
            f"pad_input_tensors(dim={dim}) is out of range for a tensor of shape "
            f"{list(tensor.shape)}."
        )
    size = tensor.shape[dim]
    if size > target:
        raise InvalidArgumentError(
            f"pad_input_tensors: a tensor has {size} rows along dim {dim}, more than the padded "
            f"size {target} computed from batch_size={batch_size}; pass the tensor's real size."
        )
    if size == target:
        return tensor
    return _pad_along(tensor, dim % tensor.ndim, target, 0, pad_first=False)
