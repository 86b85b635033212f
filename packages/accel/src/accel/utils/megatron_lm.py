"""Accelerate's ``accelerate.utils.megatron_lm`` module path: a door to :mod:`accel.megatron_lm`."""

from __future__ import annotations

from accel.errors import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.megatron_lm import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMPlugin,
    T5TrainStep,
    add_model_config_to_megatron_parser,
    avg_losses_across_data_parallel_group,
)
from accel.patch_forwarding import serve_as_door

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMPlugin",
    "T5TrainStep",
    "add_model_config_to_megatron_parser",
    "avg_losses_across_data_parallel_group",
]

serve_as_door(__name__, "accel.megatron_lm")
