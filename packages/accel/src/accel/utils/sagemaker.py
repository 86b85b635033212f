"""``accel.utils.sagemaker`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.sagemaker`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.sagemaker import (
    SageMakerDistributedType,
)
from accel_launch.launch_helpers import (
    prepare_sagemager_args_inputs,
)

__all__ = ["SageMakerDistributedType", "prepare_sagemager_args_inputs"]

serve_as_door(__name__, "accel.sagemaker")
