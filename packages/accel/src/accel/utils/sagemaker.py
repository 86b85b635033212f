"""Accelerate's SageMaker names: the enum, and a refusal for launching on SageMaker.

Amazon SageMaker is a hosted service accel does not launch on; run ``accel launch`` inside the
SageMaker job (or any machine) instead.
"""

from __future__ import annotations

import enum
from typing import Any, NoReturn

from accel.errors import UnsupportedFeatureError


class SageMakerDistributedType(str, enum.Enum):
    """SageMaker's distribution modes, by Accelerate's names (values only: nothing uses them)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


def prepare_sagemager_args_inputs(sagemaker_config: Any, args: Any) -> NoReturn:
    """Accelerate's SageMaker job arguments (its spelling); refused.

    Raises:
        UnsupportedFeatureError: Always: accel does not launch SageMaker jobs.
    """
    raise UnsupportedFeatureError(
        "prepare_sagemager_args_inputs: accel does not launch Amazon SageMaker jobs (a hosted "
        "service it cannot reach or test); start the job on SageMaker yourself and run "
        "`accel launch` inside it."
    )


__all__ = ["SageMakerDistributedType", "prepare_sagemager_args_inputs"]
