"""Accelerate's ``accelerate.hooks`` path: forward hooks for dispatched models, from accel-ckpt."""

from accel_ckpt.big_modeling.casting import LayerwiseCastingHook
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
from accel_ckpt.big_modeling.model_helpers import get_non_persistent_buffers
from accel_ckpt.big_modeling.offload import PrefixedDataset
from accel_ckpt.big_modeling.tensors import named_module_tensors, set_module_tensor_to_device
from accel_ops import find_device, send_to_device

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "find_device",
    "get_non_persistent_buffers",
    "named_module_tensors",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "send_to_device",
    "set_module_tensor_to_device",
]
