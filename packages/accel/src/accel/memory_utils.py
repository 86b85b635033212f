"""Accelerate's deprecated ``accelerate.memory_utils`` path (now ``accel.utils.memory``).

Importing it warns (``FutureWarning``), as Accelerate's does; the two helpers are re-exported.
"""

from __future__ import annotations

import warnings

from accel.memory import find_executable_batch_size, release_memory

warnings.warn(
    "accel.memory_utils moved to accel.utils.memory; import find_executable_batch_size from "
    "accel (`from accel import find_executable_batch_size`) to avoid this warning.",
    FutureWarning,
    stacklevel=2,
)

__all__ = ["find_executable_batch_size", "release_memory"]
