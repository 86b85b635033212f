"""Nested structures: attributes along a dotted path, and dicts merged level by level.

Accelerate's ``recursive_getattr`` and ``merge_dicts`` (``accelerate.utils``).

Example:
    >>> merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}})
    {'a': {'c': 2, 'b': 1}}
"""

from __future__ import annotations

import operator
from typing import Any


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer")``."""
    return operator.attrgetter(attr)(obj)


def merge_dicts(source: dict[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, not replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination
