"""Accelerate's ``accelerate.utils.sagemaker`` module path: a door to :mod:`accel.sagemaker`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.sagemaker import (
    SageMakerDistributedType,
    prepare_sagemager_args_inputs,
)

__all__ = [
    "SageMakerDistributedType",
    "prepare_sagemager_args_inputs",
]

serve_as_door(__name__, "accel.sagemaker")
