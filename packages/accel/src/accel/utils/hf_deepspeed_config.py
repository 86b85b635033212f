"""``accel.utils.hf_deepspeed_config`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.deepspeed.hf_config`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.deepspeed.hf_config import (
    HfDeepSpeedConfig as HfDeepSpeedConfig,
)

serve_as_door(__name__, "accel.strategies.deepspeed.hf_config")
