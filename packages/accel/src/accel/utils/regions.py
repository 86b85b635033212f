"""``accel.utils.regions`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.compile_regions`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.compile_regions import (
    compile_regions_deepspeed,
    compile_regions_fsdp2,
)

__all__ = ["compile_regions_deepspeed", "compile_regions_fsdp2"]

serve_as_door(__name__, "accel.strategies.compile_regions")
