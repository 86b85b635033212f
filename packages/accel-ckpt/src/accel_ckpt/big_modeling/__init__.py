"""Big-model inference: build empty, plan a device map, load tensor by tensor, run offloaded.

Example:
    >>> from accel_ckpt.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
    >>> with init_empty_weights():
    ...     model = MyModel()  # no memory allocated
    >>> model = load_checkpoint_and_dispatch(
    ...     model, "checkpoint", device_map="auto", max_memory={"cpu": "2GiB"},
    ...     offload_folder="offload", no_split_module_classes=["Block"])  # doctest: +SKIP

"""

from accel_ckpt.big_modeling.casting import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    LayerwiseCastingHook,
    attach_layerwise_casting_hooks,
)
from accel_ckpt.big_modeling.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from accel_ckpt.big_modeling.empty_init import init_empty_weights, init_on_device
from accel_ckpt.big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from accel_ckpt.big_modeling.memory import get_max_memory
from accel_ckpt.big_modeling.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from accel_ckpt.big_modeling.planning import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    get_balanced_memory,
    get_max_layer_size,
    infer_auto_device_map,
)
from accel_ckpt.big_modeling.quantization import (
    BnbQuantizationConfig,
    CustomDtype,
    has_4bit_bnb_layers,
    load_and_quantize_model,
)
from accel_ckpt.big_modeling.tensors import (
    find_tied_parameters,
    named_module_tensors,
    set_module_tensor_to_device,
)

__all__ = [
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
    "cpu_offload_with_hook",
    "disk_offload",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "offload_weight",
    "offload_state_dict",
    "save_offload_index",
    "load_offloaded_weight",
    "ModelHook",
    "SequentialHook",
    "AlignDevicesHook",
    "CpuOffload",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "attach_align_device_hook",
    "attach_execution_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_layerwise_casting_hooks",
    "LayerwiseCastingHook",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "BnbQuantizationConfig",
    "CustomDtype",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
]
