"""Accelerate's ``accelerate.utils.dataclasses`` module path: settings classes and enums."""

from __future__ import annotations

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
from accel.tracking import LoggerType
from accel_ckpt import ProjectConfiguration
from accel_ckpt.big_modeling import BnbQuantizationConfig, CustomDtype
from accel_data import DataLoaderConfiguration
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

__all__ = [
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
