"""``accel.utils.gpu_info`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.gpu_info`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.gpu_info import (
    are_libraries_initialized,
    check_cuda_p2p_ib_support,
    get_driver_version,
    get_gpu_info,
)
from accel.patch_forwarding import serve_as_door

__all__ = [
    "are_libraries_initialized",
    "check_cuda_p2p_ib_support",
    "get_driver_version",
    "get_gpu_info",
]

serve_as_door(__name__, "accel.gpu_info")
