"""Local (no communication) helpers over batches: batch size, device, concatenation, slicing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from accel_ops.errors import InvalidArgumentError, UnsupportedTypeError
from accel_ops.structures import (
    apply_to_tensors,
    honor_type,
    is_dataclass_instance,
    named_leaves,
    rebuild_mapping,
)


def find_batch_size(data: Any) -> int:
    """Size of dimension 0 of the first tensor found in ``data`` (depth first).

    Raises:
        InvalidArgumentError: ``data`` (or the first container on the way) is empty.
        UnsupportedTypeError: The first leaf is not a tensor, or is a 0-d tensor.

    """
    if isinstance(data, torch.Tensor):
        if data.ndim == 0:
            raise UnsupportedTypeError(
                "find_batch_size",
                type(data),
                "tensors with at least one dimension",
                "A 0-d tensor has no batch dimension; add one with tensor[None].",
            )
        return int(data.shape[0])
    if isinstance(data, (list, tuple, Mapping)):
        if len(data) == 0:
            raise InvalidArgumentError(
                f"find_batch_size cannot find a batch size in an empty {type(data).__name__}; "
                "pass a structure holding at least one tensor."
            )
        first = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
        return find_batch_size(first)
    if is_dataclass_instance(data):
        leaves = named_leaves(data)
        if not leaves:
            raise InvalidArgumentError(
                f"find_batch_size found no field in the dataclass {type(data).__name__}."
            )
        return find_batch_size(leaves[0][1])
    raise UnsupportedTypeError(
        "find_batch_size",
        type(data),
        "tensors nested in list/tuple/Mapping/dataclass containers",
        "The first leaf decides the batch size; put a tensor first.",
    )


def ignorant_find_batch_size(data: Any) -> int | None:
    """:func:`find_batch_size`, or None where it would raise."""
    try:
        return find_batch_size(data)
    except (InvalidArgumentError, UnsupportedTypeError):
        return None


def find_device(data: Any) -> torch.device | None:
    """Device of the first tensor found in ``data`` (depth first), or None when it holds none."""
    if isinstance(data, torch.Tensor):
        return data.device
    for _, leaf in named_leaves(data):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return None


def concatenate(data: Sequence[Any], dim: int = 0) -> Any:
    """Concatenate a list of structures of the same shape leaf by leaf with ``torch.cat``.

    A list holding a single structure gives that structure back as it is.

    Args:
        data: Structures with the same containers and keys, e.g. one per step.
        dim: The dimension to concatenate along.

    Raises:
        InvalidArgumentError: ``data`` is empty or not a list/tuple.
        UnsupportedTypeError: A leaf is not a tensor.

    """
    if not isinstance(data, (list, tuple)) or len(data) == 0:
        raise InvalidArgumentError(
            f"concatenate(data=...) needs a non-empty list of structures, got {_describe(data)}; "
            "pass e.g. [batch_0, batch_1]."
        )
    first = data[0]
    if len(data) == 1:
        return first
    if isinstance(first, (list, tuple)):
        return honor_type(
            first, (concatenate([item[i] for item in data], dim=dim) for i in range(len(first)))
        )
    if isinstance(first, Mapping):
        return rebuild_mapping(
            first, {key: concatenate([item[key] for item in data], dim=dim) for key in first}
        )
    if not isinstance(first, torch.Tensor):
        raise UnsupportedTypeError(
            "concatenate",
            type(first),
            "tensors nested in list/tuple/Mapping containers",
            "Convert the leaves to tensors before concatenating them.",
        )
    return torch.cat(list(data), dim=dim)


def slice_tensors(
    data: Any,
    tensor_slice: slice | int | Sequence[Any] | torch.Tensor,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """Index every tensor in ``data`` with ``tensor_slice`` (``tensor[tensor_slice]``).

    Args:
        data: The nested structure of tensors.
        tensor_slice: Any index a tensor accepts, e.g. ``slice(0, 8)``.
        process_index: Accepted for compatibility with Accelerate's signature; unused.
        num_processes: Accepted for compatibility with Accelerate's signature; unused.

    Raises:
        UnsupportedTypeError: A leaf is not a tensor.

    """
    return apply_to_tensors(
        "slice_tensors",
        "Only tensors can be sliced; keep other values out of the structure.",
        _index,
        data,
        tensor_slice,
    )


def _index(tensor: torch.Tensor, tensor_slice: Any) -> torch.Tensor:
    return tensor[tensor_slice]


def _describe(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}"
