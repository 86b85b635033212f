"""The ``accel.utils`` namespace: the helpers the seeds document.

They are re-exported from the packages that define them (accel-state, accel-ops, accel-data,
accel-ckpt) and from accel itself.
"""

from __future__ import annotations

from accel._lazy import lazy_exports
from accel.utils.imports import AVAILABILITY_CHECKS

_FROM_STATE = [
    "DistributedType",
    "PrecisionType",
    "RNGType",
    "ComputeEnvironment",
    "ParallelismConfig",
    "TorchTensorParallelConfig",
    "TorchContextParallelConfig",
    "DeepSpeedSequenceParallelConfig",
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
    "CannotPadNestedTensorWarning",
    "TensorInformation",
    "is_namedtuple",
    "is_tensor_information",
    "ignorant_find_batch_size",
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
_FROM_BIG_MODELING = [
    "init_empty_weights",
    "init_on_device",
    "compute_module_sizes",
    "get_max_layer_size",
    "get_max_memory",
    "get_balanced_memory",
    "infer_auto_device_map",
    "check_device_map",
    "clean_device_map",
    "find_tied_parameters",
    "named_module_tensors",
    "set_module_tensor_to_device",
    "load_checkpoint_and_dispatch",
    "dispatch_model",
    "cpu_offload",
    "disk_offload",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "offload_weight",
    "offload_state_dict",
    "save_offload_index",
    "load_offloaded_weight",
    "BnbQuantizationConfig",
    "CustomDtype",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
]
_FROM_ACCEL = {
    **dict.fromkeys(
        [
            "AORecipeKwargs",
            "FP8RecipeKwargs",
            "TERecipeKwargs",
            "MSAMPRecipeKwargs",
            "FP8BackendType",
        ],
        "accel.fp8.recipes",
    ),
    **dict.fromkeys(
        [
            "convert_model_to_fp8_ao",
            "filter_first_and_last_linear_layers",
            "has_ao_layers",
        ],
        "accel.fp8.ao",
    ),
    **dict.fromkeys(
        [
            "apply_fp8_autowrap",
            "contextual_fp8_autocast",
            "convert_model",
            "has_transformer_engine_layers",
        ],
        "accel.fp8.transformer_engine",
    ),
    "check_cuda_fp8_capability": "accel.fp8.capability",
    "merge_fsdp_weights": "accel.utils.compat",
    "save_fsdp_model": "accel.utils.fsdp_utils",
    "load_fsdp_model": "accel.utils.fsdp_utils",
    "convert_file_size_to_int": "accel.utils.compat",
    "dtype_byte_size": "accel.utils.compat",
    "has_offloaded_params": "accel.utils.compat",
    "AutocastKwargs": "accel.kwargs_handlers",
    "DistributedDataParallelKwargs": "accel.kwargs_handlers",
    "GradScalerKwargs": "accel.kwargs_handlers",
    "InitProcessGroupKwargs": "accel.kwargs_handlers",
    "KwargsHandler": "accel.kwargs_handlers",
    "TorchDynamoPlugin": "accel.kwargs_handlers",
    "GradientAccumulationPlugin": "accel.plugins",
    "DeepSpeedPlugin": "accel.utils.deepspeed",
    "DummyOptim": "accel.utils.deepspeed",
    "DummyScheduler": "accel.utils.deepspeed",
    "FullyShardedDataParallelPlugin": "accel.fsdp_plugin",
    "TorchTensorParallelPlugin": "accel.parallelism",
    "extract_model_from_parallel": "accel.utils.modeling",
    "release_memory": "accel.utils.memory",
    "find_executable_batch_size": "accel.utils.memory",
    "tqdm": "accel.utils.progress",
    "LoggerType": "accel.tracking",
    "GeneralTracker": "accel.tracking",
    "DDPCommunicationHookType": "accel.kwargs_handlers",
    "DynamoBackend": "accel.kwargs_handlers",
    "ProfileKwargs": "accel.profiling",
    "DistributedOperationException": "accel.utils.operations",
    "copy_tensor_to_devices": "accel.utils.operations",
    "PROFILE_PATTERN_NAME": "accel.profiling",
    "compile_regions": "accel.compilation",
    "has_compiled_regions": "accel.compilation",
    "SAFE_WEIGHTS_NAME": "accel_ckpt.sharding",
    "SAFE_WEIGHTS_INDEX_NAME": "accel_ckpt.sharding",
    "WEIGHTS_NAME": "accel_ckpt.sharding",
    "WEIGHTS_INDEX_NAME": "accel_ckpt.sharding",
    "write_basic_config": "accel_launch.config.defaults",
    **dict.fromkeys(
        [
            "get_int_from_env",
            "parse_flag_from_env",
            "parse_choice_from_env",
            "clear_environment",
            "convert_bytes",
            "merge_dicts",
            "recursive_getattr",
            "get_pretty_name",
            "wait_for_everyone",
            "check_os_kernel",
        ],
        "accel.utils.other",
    ),
}
# is_*_available, is_torch_version, is_compiled_module, is_port_in_use (see accel.utils.imports)
_FROM_IMPORTS = [
    *AVAILABILITY_CHECKS,
    "is_torch_version",
    "is_compiled_module",
    "is_port_in_use",
    "is_habana_gaudi1",
]

#: Accelerate's launch helpers (accel-launch, through the ``accel.utils.launch`` module path).
_FROM_LAUNCH = [
    "PrepareForLaunch",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "purge_accelerate_environment",
    "set_numa_affinity",
]

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(_FROM_STATE, "accel_state"),
    **dict.fromkeys(_FROM_OPS, "accel_ops"),
    **dict.fromkeys(_FROM_DATA, "accel_data"),
    **dict.fromkeys(_FROM_CKPT, "accel_ckpt"),
    **dict.fromkeys(_FROM_BIG_MODELING, "accel_ckpt.big_modeling"),
    **_FROM_ACCEL,
    **dict.fromkeys(_FROM_IMPORTS, "accel.utils.imports"),
    **dict.fromkeys(_FROM_LAUNCH, "accel.utils.launch"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
