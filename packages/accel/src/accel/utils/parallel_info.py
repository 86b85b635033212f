"""Accelerate's ``accelerate.utils.parallel_info`` module path: a door to :mod:`accel.strategies.parallel_info`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.parallel_info import (
    get_model_tp_size,
    model_has_dtensor,
)

__all__ = [
    "get_model_tp_size",
    "model_has_dtensor",
]

serve_as_door(__name__, "accel.strategies.parallel_info")
