"""Accelerate's operation decorators and shape exchange, on accel-ops' debug mode.

* :func:`verify_operation` wraps a function whose first argument (or ``tensor=``) is the operand
  of a collective: in debug mode every process's operand is compared first, and a mismatch raises
  :class:`DistributedOperationError` on every process (as accel-ops' own collectives do).
* :func:`chained_operation` wraps a function that calls such operations: a mismatch found inside
  is re-raised naming the outer function, chained to the original error.
* :func:`gather_tensor_shape` sends the shape and dtype of a tensor held by one process to all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from accel_ops.debug import check_operands, is_debug_mode
from accel_ops.errors import DistributedOperationError
from accel_ops.group import current_group, default_device
from accel_ops.transport import all_gather_objects

F = TypeVar("F", bound=Callable[..., Any])

#: Accelerate's integer code of each dtype that shapes are exchanged with (0 means "no tensor").
TENSOR_TYPE_TO_INT: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float64: 2,
    torch.float16: 3,
    torch.bfloat16: 4,
    torch.uint8: 5,
    torch.int8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.bool: 10,
}

#: The inverse of :data:`TENSOR_TYPE_TO_INT`.
TENSOR_INT_TO_DTYPE: dict[int, torch.dtype] = {
    code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()
}


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a ``torch.Tensor`` on an Intel XPU device."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def _operation_name(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def verify_operation(function: F) -> F:
    """Decorator: in debug mode, check the operand across processes before calling ``function``.

    The operand is the ``tensor`` keyword argument, else the first positional one. Outside debug
    mode, or without a process group of several processes, ``function`` is called directly and
    nothing is sent.

    Raises:
        DistributedOperationError: On every process, when the operands' structure, shapes or
            dtypes differ across processes (the message lists each process's).
    """
    operation = _operation_name(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        group = current_group()
        if group is not None and is_debug_mode():
            operand = kwargs["tensor"] if "tensor" in kwargs else (args[0] if args else None)
            check_operands(operation, operand, group, True)
        return function(*args, **kwargs)

    return cast(F, wrapper)


def chained_operation(function: F) -> F:
    """Decorator: re-raise a mismatch found inside ``function`` naming ``function`` too.

    Raises:
        DistributedOperationError: ``Error found while calling `<function>`...``, chained
            (``from``) to the error the inner operation raised.
    """
    operation = _operation_name(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationError as error:
            raise DistributedOperationError(
                f"Error found while calling `{operation}`. Please see the earlier error for more "
                "details.",
                operation,
                error.descriptions,
            ) from error

    return cast(F, wrapper)


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The shape and dtype code of the tensor that one process holds (the others pass None).

    Call it on every process. Returns ``(shape, dtype_code)``: the shape as a 1-d int tensor
    (on this process's device, or on the holder's device for a single process) and the code
    of :data:`TENSOR_TYPE_TO_INT` (``TENSOR_INT_TO_DTYPE[code]`` gives the dtype).

    Raises:
        ValueError: The tensor's dtype has no code, or no process passed a tensor.
        DistributedOperationError: More than one process passed a tensor.
    """
    description = None
    if tensor is not None:
        if tensor.dtype not in TENSOR_TYPE_TO_INT:
            raise ValueError(
                f"gather_tensor_shape(tensor=<{tensor.dtype} tensor>): the dtype has no code; "
                f"use one of {[str(dtype) for dtype in TENSOR_TYPE_TO_INT]}."
            )
        description = (list(tensor.shape), TENSOR_TYPE_TO_INT[tensor.dtype])
    group = current_group()
    everyone = [description] if group is None else all_gather_objects(description, group)
    held = [(rank, item) for rank, item in enumerate(everyone) if item is not None]
    if not held:
        raise ValueError(
            "gather_tensor_shape(tensor=None) on every process: one process must pass its tensor."
        )
    if len(held) > 1:
        raise DistributedOperationError(
            f"gather_tensor_shape: exactly one process must pass a tensor (the others None), but "
            f"processes {[rank for rank, _ in held]} did.",
            "accel_ops.gather_tensor_shape",
            [repr(item) for item in everyone],
        )
    shape, code = held[0][1]
    if tensor is not None:
        device = tensor.device
    else:
        device = default_device(group) if group is not None else torch.device("cpu")
    return torch.tensor(shape, dtype=torch.int64, device=device), code
