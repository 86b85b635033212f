"""Accelerate's ``accelerate.big_modeling`` path: big-model inference, defined in accel-ckpt."""

from accel.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from accel_ckpt.big_modeling import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    OffloadedWeightsLoader,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_layerwise_casting_hooks,
    check_device_map,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    offload_state_dict,
)
from accel_ckpt.big_modeling.casting import (
    _attach_layerwise_casting_hooks,
    _refuse_recurrent_layers_under_sequence_parallelism,
)
from accel_ckpt.big_modeling.model_helpers import (
    extract_submodules_state_dict,
    retie_parameters,
)
from accel_ckpt.model_loading import load_checkpoint_in_model

__all__ = [
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "OffloadedWeightsLoader",
    "UserCpuOffloadHook",
    "_attach_layerwise_casting_hooks",
    "_refuse_recurrent_layers_under_sequence_parallelism",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_layerwise_casting_hooks",
    "check_device_map",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "extract_submodules_state_dict",
    "find_tied_parameters",
    "get_balanced_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "offload_state_dict",
    "retie_parameters",
]
