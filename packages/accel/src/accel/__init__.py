"""accel: run your raw PyTorch training loop on any device and any number of processes.

Example:
    >>> from accel import Accelerator
    >>> accelerator = Accelerator()
    >>> model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)
    >>> for inputs, targets in dataloader:
    ...     loss = loss_fn(model(inputs), targets)
    ...     accelerator.backward(loss)
    ...     optimizer.step()
    ...     optimizer.zero_grad()

Names are resolved on first use, so ``import accel`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.__about__ import __version__
from accel._lazy import lazy_exports

_EXPORTS = {
    "Accelerator": "accel.accelerator",
    "AcceleratorState": "accel.accelerator_state",
    "AcceleratedOptimizer": "accel.optimizer",
    "AcceleratedScheduler": "accel.scheduler",
    "AutocastKwargs": "accel.kwargs_handlers",
    "DistributedDataParallelKwargs": "accel.kwargs_handlers",
    "GradScalerKwargs": "accel.kwargs_handlers",
    "InitProcessGroupKwargs": "accel.kwargs_handlers",
    "TorchDynamoPlugin": "accel.kwargs_handlers",
    "DDPCommunicationHookType": "accel.kwargs_handlers",
    "ProfileKwargs": "accel.profiling",
    "find_executable_batch_size": "accel.memory",
    "is_rich_available": "accel.availability",
    "GradientAccumulationPlugin": "accel.plugins",
    "FaultTolerancePlugin": "accel.replica_training",
    "DiLoCoSettings": "accel.diloco",
    "DeepSpeedPlugin": "accel.strategies.deepspeed.plugin",
    "FullyShardedDataParallelPlugin": "accel.strategies.fsdp.plugin",
    "ParallelismConfig": "accel_state",
    "TorchTensorParallelConfig": "accel_state",
    "TorchContextParallelConfig": "accel_state",
    "TorchTensorParallelPlugin": "accel.parallelism",
    "prepare_pippy": "accel.inference",
    "AccelError": "accel.errors",
    "AliasError": "accel.errors",
    "AcceleratorConfigError": "accel.errors",
    "PreparationError": "accel.errors",
    "UnsupportedFeatureError": "accel.errors",
    "PartialState": "accel_state",
    "GradientState": "accel_state",
    "DistributedType": "accel_state",
    "PrecisionType": "accel_state",
    "RNGType": "accel_state",
    "DataLoaderConfiguration": "accel_data",
    "ProjectConfiguration": "accel_ckpt",
    "load_checkpoint_in_model": "accel_ckpt",
    "skip_first_batches": "accel_data",
    "synchronize_rng_states": "accel_data",
    "set_seed": "accel_data",
    "GeneralTracker": "accel.tracking.base",
    "LoggerType": "accel.tracking.base",
    "notebook_launcher": "accel_launch",
    "debug_launcher": "accel_launch",
    # serve `import accelerate` with accel (transformers' Trainer, TRL, PEFT)
    "install_as_accelerate": "accel.accelerate_alias",
    # big-model inference (accel-ckpt)
    "init_empty_weights": "accel_ckpt.big_modeling",
    "init_on_device": "accel_ckpt.big_modeling",
    "cpu_offload": "accel_ckpt.big_modeling",
    "cpu_offload_with_hook": "accel_ckpt.big_modeling",
    "disk_offload": "accel_ckpt.big_modeling",
    "dispatch_model": "accel_ckpt.big_modeling",
    "load_checkpoint_and_dispatch": "accel_ckpt.big_modeling",
    "infer_auto_device_map": "accel_ckpt.big_modeling",
}

__all__ = ["__version__", *sorted(_EXPORTS)]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from accel.accelerate_alias import install_as_accelerate as install_as_accelerate
    from accel.accelerator import Accelerator as Accelerator
    from accel.accelerator_state import AcceleratorState as AcceleratorState
    from accel.availability import is_rich_available as is_rich_available
    from accel.diloco import DiLoCoSettings as DiLoCoSettings
    from accel.errors import AcceleratorConfigError as AcceleratorConfigError
    from accel.errors import AccelError as AccelError
    from accel.errors import AliasError as AliasError
    from accel.errors import PreparationError as PreparationError
    from accel.errors import UnsupportedFeatureError as UnsupportedFeatureError
    from accel.inference import prepare_pippy as prepare_pippy
    from accel.kwargs_handlers import AutocastKwargs as AutocastKwargs
    from accel.kwargs_handlers import DDPCommunicationHookType as DDPCommunicationHookType
    from accel.kwargs_handlers import DistributedDataParallelKwargs as DistributedDataParallelKwargs
    from accel.kwargs_handlers import GradScalerKwargs as GradScalerKwargs
    from accel.kwargs_handlers import InitProcessGroupKwargs as InitProcessGroupKwargs
    from accel.kwargs_handlers import TorchDynamoPlugin as TorchDynamoPlugin
    from accel.memory import find_executable_batch_size as find_executable_batch_size
    from accel.optimizer import AcceleratedOptimizer as AcceleratedOptimizer
    from accel.parallelism import TorchTensorParallelPlugin as TorchTensorParallelPlugin
    from accel.plugins import GradientAccumulationPlugin as GradientAccumulationPlugin
    from accel.profiling import ProfileKwargs as ProfileKwargs
    from accel.replica_training import FaultTolerancePlugin as FaultTolerancePlugin
    from accel.scheduler import AcceleratedScheduler as AcceleratedScheduler
    from accel.strategies.deepspeed.plugin import DeepSpeedPlugin as DeepSpeedPlugin
    from accel.strategies.fsdp.plugin import (
        FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
    )
    from accel.tracking.base import GeneralTracker as GeneralTracker
    from accel.tracking.base import LoggerType as LoggerType
    from accel_ckpt import ProjectConfiguration as ProjectConfiguration
    from accel_ckpt import load_checkpoint_in_model as load_checkpoint_in_model
    from accel_ckpt.big_modeling import cpu_offload as cpu_offload
    from accel_ckpt.big_modeling import cpu_offload_with_hook as cpu_offload_with_hook
    from accel_ckpt.big_modeling import disk_offload as disk_offload
    from accel_ckpt.big_modeling import dispatch_model as dispatch_model
    from accel_ckpt.big_modeling import infer_auto_device_map as infer_auto_device_map
    from accel_ckpt.big_modeling import init_empty_weights as init_empty_weights
    from accel_ckpt.big_modeling import init_on_device as init_on_device
    from accel_ckpt.big_modeling import (
        load_checkpoint_and_dispatch as load_checkpoint_and_dispatch,
    )
    from accel_data import DataLoaderConfiguration as DataLoaderConfiguration
    from accel_data import set_seed as set_seed
    from accel_data import skip_first_batches as skip_first_batches
    from accel_data import synchronize_rng_states as synchronize_rng_states
    from accel_launch import debug_launcher as debug_launcher
    from accel_launch import notebook_launcher as notebook_launcher
    from accel_state import DistributedType as DistributedType
    from accel_state import GradientState as GradientState
    from accel_state import ParallelismConfig as ParallelismConfig
    from accel_state import PartialState as PartialState
    from accel_state import PrecisionType as PrecisionType
    from accel_state import RNGType as RNGType
    from accel_state import TorchContextParallelConfig as TorchContextParallelConfig
    from accel_state import TorchTensorParallelConfig as TorchTensorParallelConfig
