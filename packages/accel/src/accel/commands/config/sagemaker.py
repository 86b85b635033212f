"""Accelerate's ``accelerate.commands.config.sagemaker``: accel does not launch on SageMaker.

The names are here so that imports work; :func:`get_sagemaker_input` refuses with the reason.
"""

from __future__ import annotations

from accel.commands.config.config_args import SageMakerConfig, _refuse_sagemaker
from accel_launch.config.schema import DYNAMO_BACKENDS, DYNAMO_MODES

SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]
TORCH_DYNAMO_MODES = DYNAMO_MODES

__all__ = [
    "DYNAMO_BACKENDS",
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "TORCH_DYNAMO_MODES",
    "get_sagemaker_input",
]


def get_sagemaker_input() -> SageMakerConfig:
    """Refuse: SageMaker launches are not supported by accel.

    Raises:
        accel_launch.errors.LaunchArgumentError: Always, saying what to do instead.
    """
    raise _refuse_sagemaker("get_sagemaker_input")
