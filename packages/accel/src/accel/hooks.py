"""Accelerate's ``accelerate.hooks`` path: forward hooks for dispatched models, from accel-ckpt."""

from accel_ckpt.big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_execution_device_hook",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]
