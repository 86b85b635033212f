"""Accelerate's ``accelerate.utils.environment`` module path: environment-variable helpers."""

from __future__ import annotations

from accel.utils.other import (
    check_os_kernel,
    clear_environment,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
)
from accel_state import patch_environment, str_to_bool

__all__ = [
    "check_os_kernel",
    "clear_environment",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "str_to_bool",
]
