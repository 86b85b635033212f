"""Accelerate's ``accelerate.utils.progress`` module path: a door to :mod:`accel.progress`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.progress import (
    PartialState as PartialState,
)
from accel.progress import (
    tqdm as tqdm,
)

serve_as_door(__name__, "accel.progress")
