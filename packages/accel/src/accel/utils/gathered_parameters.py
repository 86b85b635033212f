"""``accel.utils.gathered_parameters`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.deepspeed.gathered_parameters`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.deepspeed.gathered_parameters import (
    GatheredParameters,
)

__all__ = ["GatheredParameters"]

serve_as_door(__name__, "accel.strategies.deepspeed.gathered_parameters")
