"""Accelerate's ``accelerate.commands.config.cluster``: the questions for a local-machine config.

accel-launch's questionnaire asks them (machines, processes, precision, DeepSpeed, FSDP,
torch.compile); the allowed values are accel-launch's config schema's.
"""

from __future__ import annotations

from accel.commands.config.config_args import ClusterConfig
from accel_launch.config.questionnaire import run_questionnaire
from accel_launch.config.schema import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FSDP_STATE_DICT_TYPES,
)

FSDP_AUTO_WRAP_POLICY = FSDP_AUTO_WRAP_POLICIES
FSDP_SHARDING_STRATEGY = FSDP_SHARDING_STRATEGIES
FSDP_STATE_DICT_TYPE = FSDP_STATE_DICT_TYPES
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
TORCH_DYNAMO_MODES = DYNAMO_MODES

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "TORCH_DYNAMO_MODES",
    "get_cluster_input",
]


def get_cluster_input() -> ClusterConfig:
    """Ask the questions on the terminal; the answers as a :class:`ClusterConfig`."""
    return ClusterConfig.from_mapping(run_questionnaire().to_dict(), "your answers")
