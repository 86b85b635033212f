"""``accel.utils.env_values`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.env_values`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.env_values import (
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
)
from accel.patch_forwarding import serve_as_door
from accel_state import (
    str_to_bool as str_to_bool,
)

__all__ = ["get_int_from_env", "parse_choice_from_env", "parse_flag_from_env"]

serve_as_door(__name__, "accel.env_values")
