"""Accelerate's SageMaker names: the enum, and accel-launch's refusal to launch on SageMaker.

Amazon SageMaker is a hosted service accel does not launch on; run ``accel launch`` inside the
SageMaker job (or any machine) instead.
"""

from __future__ import annotations

import enum

from accel_launch.launch_helpers import prepare_sagemager_args_inputs


class SageMakerDistributedType(str, enum.Enum):
    """SageMaker's distribution modes, by Accelerate's names (values only: nothing uses them)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


__all__ = ["SageMakerDistributedType", "prepare_sagemager_args_inputs"]
