"""Settings read from environment variables (Accelerate's ``get_int_from_env`` and its kin).

A module of its own, importing nothing of accel, so that ``accel.accelerator_state`` and the
``accel.utils`` doors can all hand these out from one low-level place.

Example:
    >>> from accel.utils import get_int_from_env
    >>> get_int_from_env(["SURELY_UNSET_RANK"], 0)
    0
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from accel_state import str_to_bool


def get_int_from_env(env_keys: Sequence[str], default: int) -> int:
    """The first of ``env_keys`` set to a non-negative integer, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """A boolean environment variable (``1``/``true``/``yes``...), ``default`` when unset."""
    return bool(str_to_bool(os.environ.get(key, str(default))))


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """A string environment variable, ``default`` when unset."""
    return os.environ.get(key, str(default))


__all__ = ["get_int_from_env", "parse_choice_from_env", "parse_flag_from_env"]
