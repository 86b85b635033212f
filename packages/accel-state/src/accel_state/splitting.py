"""Splitting a list, tuple, tensor, dataset or dict of those into one contiguous share per process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def share_bounds(length: int, num_processes: int, process_index: int) -> tuple[int, int]:
    """Start and end of ``process_index``'s share; the first ``length % num_processes`` get one more."""
    base, extra = divmod(length, num_processes)
    start = process_index * base + min(process_index, extra)
    return start, start + base + (1 if process_index < extra else 0)


def split_inputs(
    inputs: T, num_processes: int, process_index: int, apply_padding: bool = False
) -> T:
    """Return this process's contiguous share of ``inputs``.

    A string (or bytes) is one item, not a sequence: every process gets all of it, as with
    Accelerate.

    Args:
        inputs: A list, tuple, tensor (split on dim 0), a Hugging Face ``datasets.Dataset``
            (split by rows with its ``select``), or a Mapping of those (all the same length);
            or a string.
        num_processes: How many shares.
        process_index: Which share.
        apply_padding: Repeat the last element so every share has the same length.

    Raises:
        TypeError: An input of another type.
        ValueError: A Mapping whose values differ in length.

    """
    if isinstance(inputs, (str, bytes)):
        return inputs
    if isinstance(inputs, Mapping):
        lengths = {key: _length(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"split_between_processes needs every value of the dict to have the same length, got {lengths}."
            )
        split = {
            key: split_inputs(value, num_processes, process_index, apply_padding)
            for key, value in inputs.items()
        }
        return type(inputs)(split)  # type: ignore[call-arg]
    if _is_row_selectable(inputs):
        return _split_rows(inputs, num_processes, process_index, apply_padding)  # type: ignore[no-any-return]
    length = _length(inputs)
    start, end = share_bounds(length, num_processes, process_index)
    share: Any = inputs[start:end]  # type: ignore[index]
    target = -(-length // num_processes)
    if not apply_padding or len(share) >= target or length == 0:
        return share  # type: ignore[no-any-return]
    missing = target - len(share)
    if isinstance(inputs, torch.Tensor):
        filler = share[-1:] if len(share) else inputs[-1:]
        return torch.cat([share, filler.expand(missing, *filler.shape[1:])])  # type: ignore[return-value]
    filler_item = share[-1] if len(share) else inputs[-1]  # type: ignore[index]
    return share + type(share)([filler_item] * missing)  # type: ignore[no-any-return]


def _is_row_selectable(value: object) -> bool:
    """A table that picks rows by index with ``select`` (Hugging Face ``datasets.Dataset``)."""
    return callable(getattr(value, "select", None)) and hasattr(value, "column_names")


def _split_rows(inputs: Any, num_processes: int, process_index: int, apply_padding: bool) -> Any:
    """This process's rows of a ``datasets.Dataset``-like table (no copy: ``select`` indexes)."""
    length = len(inputs)
    start, end = share_bounds(length, num_processes, process_index)
    rows = list(range(start, end))
    target = -(-length // num_processes)
    if apply_padding and length and len(rows) < target:
        rows += [rows[-1] if rows else length - 1] * (target - len(rows))
    return inputs.select(rows)


def _length(value: object) -> int:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise TypeError("split_between_processes cannot split a 0-d tensor.")
        return int(value.shape[0])
    if isinstance(value, (list, tuple)):
        return len(value)
    raise TypeError(
        f"split_between_processes accepts lists, tuples, tensors, datasets.Dataset, dicts of "
        "those and strings, "
        f"not {type(value).__name__}; convert it, e.g. list(inputs)."
    )
