"""Accelerate's ``accelerate.utils.dataclasses`` module path: settings classes and enums."""

from __future__ import annotations

from typing import Literal

from accel.fp8.recipes import (
    AORecipeKwargs,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)
from accel.kwargs_handlers import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DynamoBackend,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    TorchDynamoPlugin,
)
from accel.parallelism import TorchTensorParallelPlugin
from accel.plugins import GradientAccumulationPlugin
from accel.profiling import ProfileKwargs
from accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from accel.tracking.base import LoggerType
from accel.utils.deepspeed import DeepSpeedPlugin
from accel.utils.megatron_lm import MegatronLMPlugin, add_model_config_to_megatron_parser
from accel.utils.sagemaker import SageMakerDistributedType
from accel_ckpt import ProjectConfiguration
from accel_ckpt.big_modeling import BnbQuantizationConfig, CustomDtype
from accel_ckpt.big_modeling.model_helpers import get_module_class_from_name
from accel_data import DataLoaderConfiguration
from accel_ops import TensorInformation
from accel_state import (
    ComputeEnvironment,
    DeepSpeedSequenceParallelConfig,
    DistributedType,
    ParallelismConfig,
    PrecisionType,
    RNGType,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from accel_state.types import BaseEnum, EnumWithContains

#: The values Accelerate's FP8 and profiler settings take (type aliases, as in Accelerate).
Backend = Literal["MSAMP", "TE"]  # FP8 backends of FP8RecipeKwargs (accel also takes "AO")
OptLevel = Literal["O1", "O2"]  # MS-AMP optimisation levels (MSAMPRecipeKwargs.opt_level)
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]  # TERecipeKwargs.fp8_format
AmaxComputeAlgorithm = Literal["max", "most_recent"]  # TERecipeKwargs.amax_compute_algo
ProfilerActivity = Literal["cpu", "xpu", "mtia", "cuda", "hpu"]  # ProfileKwargs.activities

__all__ = [
    "AmaxComputeAlgorithm",
    "Backend",
    "BaseEnum",
    "EnumWithContains",
    "FP8Format",
    "OptLevel",
    "ProfilerActivity",
    "get_module_class_from_name",
    "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin",
    "MegatronLMPlugin",
    "SageMakerDistributedType",
    "TensorInformation",
    "add_model_config_to_megatron_parser",
    "AORecipeKwargs",
    "AutocastKwargs",
    "BnbQuantizationConfig",
    "CustomDtype",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "MSAMPRecipeKwargs",
    "TERecipeKwargs",
    "ComputeEnvironment",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "ParallelismConfig",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
]
