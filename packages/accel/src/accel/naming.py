"""Readable names of objects for messages (Accelerate's ``get_pretty_name``).

Example:
    >>> get_pretty_name(dict.get)
    'dict.get'
"""

from __future__ import annotations

from typing import Any


def get_pretty_name(obj: Any) -> str:
    """The qualified name of a class or function (of the object's class otherwise)."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = type(obj)
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or obj)
