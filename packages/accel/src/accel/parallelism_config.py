"""Accelerate's ``accelerate.parallelism_config`` module path (defined in accel-state)."""

from accel_state.parallelism_config import (
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)

__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
]
