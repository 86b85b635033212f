"""Accelerate's ``accelerate.utils.gathered_parameters`` module path: a door to :mod:`accel.strategies.gathered_parameters`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.gathered_parameters import (
    GatheredParameters,
)

__all__ = [
    "GatheredParameters",
]

serve_as_door(__name__, "accel.strategies.gathered_parameters")
