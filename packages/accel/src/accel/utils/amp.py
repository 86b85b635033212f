"""``accel.utils.amp`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.amp`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.amp import (
    get_current_device_type,
    get_grad_scaler,
    get_mixed_precision_context_manager,
)
from accel.kwargs_handlers import (
    AutocastKwargs as AutocastKwargs,
)
from accel.patch_forwarding import serve_as_door
from accel_state import (
    DistributedType as DistributedType,
)

__all__ = ["get_current_device_type", "get_grad_scaler", "get_mixed_precision_context_manager"]

serve_as_door(__name__, "accel.amp")
