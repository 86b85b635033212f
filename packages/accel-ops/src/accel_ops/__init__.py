"""accel-ops: collectives over nested tensors (gather, broadcast, reduce, pad, move to device).

Works on whatever default ``torch.distributed`` process group exists (started by
``accel_state.PartialState``, ``torchrun`` or your own code), and as a single process when there
is none.

Example:
    >>> import torch
    >>> from accel_ops import gather, pad_across_processes
    >>> batch = {"logits": torch.randn(3, 10), "labels": torch.arange(3)}
    >>> everything = gather(pad_across_processes(batch, dim=0))

"""

from accel_ops.__about__ import __version__
from accel_ops.batching import (
    concatenate,
    find_batch_size,
    find_device,
    ignorant_find_batch_size,
    slice_tensors,
)
from accel_ops.collectives import broadcast, copy_tensor_to_devices, gather, reduce
from accel_ops.conversion import (
    ConvertOutputsToFp32,
    convert_outputs_to_fp32,
    convert_to_fp32,
    listify,
)
from accel_ops.debug import is_debug_mode, set_debug_mode
from accel_ops.device_transfer import send_to_device
from accel_ops.errors import (
    AccelOpsError,
    CannotPadNestedTensorWarning,
    CollectiveFailedError,
    CollectiveTimeoutError,
    DistributedOperationError,
    DistributedOperationException,
    InvalidArgumentError,
    UnsupportedTypeError,
    XLAUnavailableError,
)
from accel_ops.objects import broadcast_object_list, gather_object, gather_objects_by_rank
from accel_ops.padding import pad_across_processes, pad_input_tensors
from accel_ops.structures import (
    TensorInformation,
    get_data_structure,
    get_shape,
    honor_type,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    recursively_apply,
)
from accel_ops.verification import (
    TENSOR_INT_TO_DTYPE,
    TENSOR_TYPE_TO_INT,
    chained_operation,
    gather_tensor_shape,
    is_torch_xpu_tensor,
    verify_operation,
)

__all__ = [
    "__version__",
    # verification (Accelerate's operation decorators and dtype codes)
    "TENSOR_INT_TO_DTYPE",
    "TENSOR_TYPE_TO_INT",
    "chained_operation",
    "gather_tensor_shape",
    "is_torch_xpu_tensor",
    "verify_operation",
    # structures
    "TensorInformation",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "recursively_apply",
    # local helpers
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "ConvertOutputsToFp32",
    "find_batch_size",
    "find_device",
    "ignorant_find_batch_size",
    "listify",
    "send_to_device",
    "slice_tensors",
    "pad_input_tensors",
    # collectives
    "broadcast",
    "broadcast_object_list",
    "copy_tensor_to_devices",
    "gather",
    "gather_object",
    "gather_objects_by_rank",
    "pad_across_processes",
    "reduce",
    # debug mode
    "is_debug_mode",
    "set_debug_mode",
    # errors
    "AccelOpsError",
    "CannotPadNestedTensorWarning",
    "CollectiveFailedError",
    "CollectiveTimeoutError",
    "DistributedOperationError",
    "DistributedOperationException",
    "InvalidArgumentError",
    "UnsupportedTypeError",
    "XLAUnavailableError",
]
