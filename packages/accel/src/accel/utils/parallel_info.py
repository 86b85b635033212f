"""``accel.utils.parallel_info`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.parallel_info`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.parallel_info import (
    get_model_tp_size,
    model_has_dtensor,
)

__all__ = ["get_model_tp_size", "model_has_dtensor"]

serve_as_door(__name__, "accel.strategies.parallel_info")
