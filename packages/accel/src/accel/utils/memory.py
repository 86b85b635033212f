"""Accelerate's ``accelerate.utils.memory`` module path: a door to :mod:`accel.memory`."""

from __future__ import annotations

from accel.memory import (
    R as R,
)
from accel.memory import (
    clear_device_cache as clear_device_cache,
)
from accel.memory import (
    find_executable_batch_size as find_executable_batch_size,
)
from accel.memory import (
    release_memory as release_memory,
)
from accel.memory import (
    should_reduce_batch_size as should_reduce_batch_size,
)
from accel.patch_forwarding import serve_as_door

serve_as_door(__name__, "accel.memory")
