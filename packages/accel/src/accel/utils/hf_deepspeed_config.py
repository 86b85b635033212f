"""Accelerate's ``accelerate.utils.hf_deepspeed_config`` module path: a door to :mod:`accel.strategies.deepspeed_hf_config`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.deepspeed_hf_config import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.strategies.deepspeed_hf_config import (
    HfDeepSpeedConfig as HfDeepSpeedConfig,
)

serve_as_door(__name__, "accel.strategies.deepspeed_hf_config")
