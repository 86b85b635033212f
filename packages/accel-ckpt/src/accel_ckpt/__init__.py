"""Model and training-state checkpoints: sharded safetensors, atomic, safe to load.

Example:
    >>> from accel_ckpt import save_state, load_state
    >>> save_state("ckpt", models=[model], optimizers=[optimizer])  # doctest: +SKIP
    >>> load_state("ckpt", models=[model], optimizers=[optimizer])  # doctest: +SKIP

"""

import os as _os

from accel_ckpt.__about__ import __version__
from accel_ckpt.accelerate_import import is_accelerate_checkpoint
from accel_ckpt.async_save import AsyncSave, release_staging_memory, wait_for_pending_saves
from accel_ckpt.big_modeling import (
    check_device_map,
    compute_module_sizes,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    find_tied_parameters,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from accel_ckpt.checkpointer import Checkpointer
from accel_ckpt.errors import (
    AccelCkptError,
    AsyncSaveError,
    CheckpointContentsError,
    CheckpointDiskFullError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DeviceMapError,
    DispatchedModelError,
    DistributedCheckpointError,
    IncompleteCheckpointError,
    InsufficientMemoryError,
    InvalidArgumentError,
    InvalidSavePlanError,
    PathEscapeError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    UnsupportedValueError,
)
from accel_ckpt.manifest import (
    MANIFEST_NAME,
    Manifest,
    is_complete,
    read_manifest,
    verify_checkpoint,
)
from accel_ckpt.model_io import save_model, unwrap_model
from accel_ckpt.model_loading import IncompatibleKeys, load_checkpoint_in_model
from accel_ckpt.project import ProjectConfiguration, latest_checkpoint
from accel_ckpt.rng_state import capture_rng_states, restore_rng_states
from accel_ckpt.serialization import load, save
from accel_ckpt.sharded_state import ShardedState, StageableShardedState, StagedWrite
from accel_ckpt.sharding import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from accel_ckpt.sizes import parse_size
from accel_ckpt.stateful import LoadHook, SaveHook, Stateful
from accel_ckpt.training_objects import TrainingObjects
from accel_ckpt.training_state import LoadedCheckpoint, load_state, save_state
from accel_ops.records import register_internal_package

__all__ = [
    "__version__",
    # model weights
    "save_model",
    "load_checkpoint_in_model",
    "unwrap_model",
    "IncompatibleKeys",
    "parse_size",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    # big-model inference
    "init_empty_weights",
    "init_on_device",
    "compute_module_sizes",
    "get_max_memory",
    "get_balanced_memory",
    "infer_auto_device_map",
    "check_device_map",
    "find_tied_parameters",
    "load_checkpoint_and_dispatch",
    "dispatch_model",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    # training state
    "save_state",
    "load_state",
    "LoadedCheckpoint",
    "Stateful",
    "SaveHook",
    "LoadHook",
    "AsyncSave",
    "wait_for_pending_saves",
    "release_staging_memory",
    "Checkpointer",
    "ProjectConfiguration",
    "ShardedState",
    "StageableShardedState",
    "StagedWrite",
    "latest_checkpoint",
    "Manifest",
    "MANIFEST_NAME",
    "read_manifest",
    "is_complete",
    "verify_checkpoint",
    "is_accelerate_checkpoint",
    "capture_rng_states",
    "restore_rng_states",
    # single objects
    "save",
    "load",
    # errors
    "AccelCkptError",
    "AsyncSaveError",
    "CheckpointContentsError",
    "CheckpointDiskFullError",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "DeviceMapError",
    "DispatchedModelError",
    "InsufficientMemoryError",
    "DistributedCheckpointError",
    "IncompleteCheckpointError",
    "InvalidArgumentError",
    "InvalidSavePlanError",
    "PathEscapeError",
    "StateDictMismatchError",
    "UnsafeCheckpointError",
    "UnsupportedValueError",
    "TrainingObjects",
]

# Collective records name the caller's line, skipping this package's frames.
register_internal_package(_os.path.dirname(_os.path.abspath(__file__)))
