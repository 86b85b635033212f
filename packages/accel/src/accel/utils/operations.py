"""Accelerate's ``accelerate.utils.operations`` module path: re-exports of :mod:`accel_ops`.

``DistributedOperationException`` is the error debug mode raises when processes pass mismatched
operands to a collective (the same class as ``accel_ops.DistributedOperationError``).
"""

from __future__ import annotations

from accel_ops import (
    CannotPadNestedTensorWarning,
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    get_data_structure,
    honor_type,
    initialize_tensors,
    is_torch_tensor,
    listify,
    pad_across_processes,
    pad_input_tensors,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)

__all__ = [
    "CannotPadNestedTensorWarning",
    "DistributedOperationException",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
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
