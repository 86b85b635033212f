"""``accel.utils.progress`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.progress`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.progress import (
    tqdm as tqdm,
)
from accel_state import (
    PartialState as PartialState,
)

serve_as_door(__name__, "accel.progress")
