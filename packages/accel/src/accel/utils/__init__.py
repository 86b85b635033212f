"""The ``accel.utils`` namespace: the helpers the seeds document.

They are re-exported from the packages that define them (accel-state, accel-ops, accel-data,
accel-ckpt) and from accel itself.
"""

from __future__ import annotations

from accel._lazy import lazy_exports

_FROM_STATE = [
    "DistributedType",
    "PrecisionType",
    "RNGType",
    "ComputeEnvironment",
    "patch_environment",
    "str_to_bool",
]
_FROM_OPS = [
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "get_data_structure",
    "honor_type",
    "initialize_tensors",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]
_FROM_DATA = [
    "DataLoaderConfiguration",
    "set_seed",
    "skip_first_batches",
    "synchronize_rng_state",
    "synchronize_rng_states",
]
_FROM_CKPT = [
    "ProjectConfiguration",
    "load_checkpoint_in_model",
    "save",
    "load",
    "parse_size",
]
_FROM_ACCEL = {
    "AutocastKwargs": "accel.kwargs_handlers",
    "DistributedDataParallelKwargs": "accel.kwargs_handlers",
    "GradScalerKwargs": "accel.kwargs_handlers",
    "InitProcessGroupKwargs": "accel.kwargs_handlers",
    "KwargsHandler": "accel.kwargs_handlers",
    "TorchDynamoPlugin": "accel.kwargs_handlers",
    "GradientAccumulationPlugin": "accel.plugins",
    "FullyShardedDataParallelPlugin": "accel.fsdp_plugin",
    "extract_model_from_parallel": "accel.utils.modeling",
    "release_memory": "accel.utils.memory",
    "find_executable_batch_size": "accel.utils.memory",
    "tqdm": "accel.utils.progress",
    "LoggerType": "accel.tracking",
    "GeneralTracker": "accel.tracking",
}

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(_FROM_STATE, "accel_state"),
    **dict.fromkeys(_FROM_OPS, "accel_ops"),
    **dict.fromkeys(_FROM_DATA, "accel_data"),
    **dict.fromkeys(_FROM_CKPT, "accel_ckpt"),
    **_FROM_ACCEL,
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
