"""Accelerate's ``accelerate.utils.env_values`` module path: a door to :mod:`accel.env_values`."""

from __future__ import annotations

from accel.env_values import (
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
)
from accel.env_values import (
    str_to_bool as str_to_bool,
)
from accel.patch_forwarding import serve_as_door

__all__ = [
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
]

serve_as_door(__name__, "accel.env_values")
