"""Accelerate's ``accelerate.utils.modeling`` path: model sizes, device maps, tied weights, loading.

The implementations live in accel-ckpt (``accel_ckpt.big_modeling``, ``accel_ckpt.model_loading``)
and accel (mixed precision, unwrapping); these are the same objects as in ``accel.utils``.

Example:
    >>> import torch
    >>> from accel.utils.modeling import compute_module_sizes
    >>> compute_module_sizes(torch.nn.Linear(2, 2))[""]
    24
"""

from __future__ import annotations

from accel.amp import get_grad_scaler, get_mixed_precision_context_manager
from accel.ckpt_adapters import convert_file_size_to_int, dtype_byte_size, has_offloaded_params
from accel.modeling import extract_model_from_parallel, is_peft_model
from accel_ckpt.big_modeling.memory import get_max_memory
from accel_ckpt.big_modeling.model_helpers import (
    align_module_device,
    calculate_maximum_sizes,
    check_device_same,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    compute_module_total_buffer_size,
    get_module_leaves,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    id_tensor_storage,
    load_offloaded_weights,
    load_state_dict,
    retie_parameters,
)
from accel_ckpt.big_modeling.offload import (
    load_offloaded_weight,
    offload_weight,
    save_offload_index,
)
from accel_ckpt.big_modeling.planning import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    fallback_allocate,
    get_balanced_memory,
    get_max_layer_size,
    infer_auto_device_map,
)
from accel_ckpt.big_modeling.tensors import (
    find_tied_parameters,
    named_module_tensors,
    set_module_tensor_to_device,
)
from accel_ckpt.dtypes import CustomDtype
from accel_ckpt.model_loading import load_checkpoint_in_model
from accel_ckpt.sharding import SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

__all__ = [
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "CustomDtype",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "fallback_allocate",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "extract_model_from_parallel",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "offload_weight",
    "retie_parameters",
    "save_offload_index",
    "set_module_tensor_to_device",
]
