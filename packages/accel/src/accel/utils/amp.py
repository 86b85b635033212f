"""Accelerate's ``accelerate.utils.amp`` module path: a door to :mod:`accel.amp`."""

from __future__ import annotations

from accel.amp import (
    AutocastKwargs as AutocastKwargs,
)
from accel.amp import (
    DistributedType as DistributedType,
)
from accel.amp import (
    get_current_device_type,
    get_grad_scaler,
    get_mixed_precision_context_manager,
)
from accel.patch_forwarding import serve_as_door

__all__ = [
    "get_current_device_type",
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
]

serve_as_door(__name__, "accel.amp")
