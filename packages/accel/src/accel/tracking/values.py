"""Logged values made plain for a tracker: Python numbers, JSON-safe structures, text."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def plain_value(value: Any) -> Any:
    """JSON-safe version of a logged value (tensors and numpy scalars become numbers)."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, Mapping):
        return {str(key): plain_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def scalar(value: Any) -> Any:
    """A one-element tensor or numpy scalar as a Python number; anything else unchanged."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        try:
            return value.item()
        except (ValueError, RuntimeError):
            return value
    return value


def scalars(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with one-element tensors and numpy scalars as Python numbers."""
    return {key: scalar(value) for key, value in values.items()}


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` (``bool`` excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
