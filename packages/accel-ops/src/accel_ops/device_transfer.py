"""Move nested structures of tensors (and objects with a ``.to`` method) to a device."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

import torch

from accel_ops.errors import InvalidArgumentError
from accel_ops.structures import (
    honor_type,
    is_dataclass_instance,
    rebuild_dataclass,
    rebuild_mapping,
)

Device = torch.device | str | int


def send_to_device(
    tensor: Any,
    device: Device,
    non_blocking: bool = False,
    skip_keys: str | Collection[str] | None = None,
) -> Any:
    """Move ``tensor`` (or every tensor nested in it) to ``device``, keeping the containers' types.

    Leaves with a ``.to`` method (modules, ``BatchEncoding``-like mappings) are moved with it; other
    leaves pass through unchanged.

    Args:
        tensor: A tensor, an object with ``.to``, or list/tuple/Mapping/dataclass containers of them.
        device: Target device (``"cuda:0"``, ``torch.device("cpu")``, a CUDA index...).
        non_blocking: Ask for an asynchronous copy (only meaningful from pinned memory).
        skip_keys: Mapping keys whose values stay where they are, at any depth. When given, a
            Mapping with a ``.to`` method is walked key by key so the keys can be skipped.

    Returns:
        The structure with its tensors on ``device``.

    Raises:
        InvalidArgumentError: ``skip_keys`` is not a string or a collection of strings.

    """
    skipped = _normalise_skip_keys(skip_keys)
    return _send(tensor, device, non_blocking, skipped)


#: No key skipped: a constant, so ``torch.compile`` on torch 2.4 (whose dynamo cannot trace a
#: ``frozenset()`` call) compiles ``send_to_device`` without skip keys, as later releases do.
_NO_SKIP_KEYS: frozenset[Any] = frozenset()


def _normalise_skip_keys(skip_keys: str | Collection[str] | None) -> frozenset[Any]:
    if skip_keys is None:
        return _NO_SKIP_KEYS
    if isinstance(skip_keys, str):
        return frozenset((skip_keys,))
    if isinstance(skip_keys, Collection) and not isinstance(skip_keys, Mapping):
        return frozenset(skip_keys)
    raise InvalidArgumentError(
        f"send_to_device(skip_keys={skip_keys!r}) must be a key or a list of keys, e.g. "
        'skip_keys=["labels"].'
    )


def _send(data: Any, device: Device, non_blocking: bool, skip_keys: frozenset[Any]) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, Mapping) and skip_keys:
        return rebuild_mapping(
            data,
            {
                key: value if key in skip_keys else _send(value, device, non_blocking, skip_keys)
                for key, value in data.items()
            },
        )
    if hasattr(data, "to") and not isinstance(data, type):
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() that takes no non_blocking argument
            return data.to(device)
    if isinstance(data, (list, tuple)):
        return honor_type(data, (_send(item, device, non_blocking, skip_keys) for item in data))
    if isinstance(data, Mapping):
        return rebuild_mapping(
            data,
            {key: _send(value, device, non_blocking, skip_keys) for key, value in data.items()},
        )
    if is_dataclass_instance(data):
        return rebuild_dataclass(
            data,
            {
                field.name: _send(getattr(data, field.name), device, non_blocking, skip_keys)
                for field in dataclasses.fields(data)
            },
        )
    return data
