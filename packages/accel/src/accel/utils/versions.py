"""Accelerate's ``accelerate.utils.versions`` module path: a door to :mod:`accel.versions`."""

from __future__ import annotations

from accel.availability import (
    is_torch_version,
)
from accel.constants import (
    STR_OPERATION_TO_FUNC as STR_OPERATION_TO_FUNC,
)
from accel.patch_forwarding import serve_as_door
from accel.versions import (
    compare_versions,
    torch_version,
)

__all__ = ["compare_versions", "is_torch_version", "torch_version"]

serve_as_door(__name__, "accel.versions")
