"""Accelerate's free-standing precision helpers: a grad scaler and an autocast context.

Inside training, the :class:`~accel.Accelerator` owns precision (``accelerator.scaler``,
``accelerator.autocast()``); these build the same objects for code outside it.

Example:
    >>> from accel.utils import get_grad_scaler
    >>> scaler = get_grad_scaler(init_scale=1024.0)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from accel.kwargs_handlers import AutocastKwargs
from accel.precision import autocast_dtype
from accel_state import DistributedType

_ACCELERATOR_TYPES = (
    ("mlu", "MULTI_MLU"),
    ("sdaa", "MULTI_SDAA"),
    ("musa", "MULTI_MUSA"),
    ("npu", "MULTI_NPU"),
    ("hpu", "MULTI_HPU"),
    ("cuda", "MULTI_GPU"),
    ("xpu", "MULTI_XPU"),
    ("neuron", "MULTI_NEURON"),
)


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of this machine's accelerator, without using it.

    Nothing is initialised (safe before forking). The first accelerator found in Accelerate's
    order (MLU, SDAA, MUSA, NPU, HPU, CUDA, XPU, Neuron) wins; a machine with none gives
    ``("cpu", "MULTI_CPU")`` where Accelerate answers ``("cuda", "MULTI_GPU")``.
    """
    for device_type, distributed_type in _ACCELERATOR_TYPES:
        module = getattr(torch, device_type, None)
        is_available = getattr(module, "is_available", None)
        if callable(is_available) and is_available():
            return device_type, distributed_type
    return "cpu", "MULTI_CPU"


def get_grad_scaler(distributed_type: DistributedType | None = None, **kwargs: Any) -> Any:
    """A gradient scaler for this machine's device (``ShardedGradScaler`` under FSDP).

    Args:
        distributed_type: ``DistributedType.FSDP`` gives torch's sharded scaler (FSDP1).
        **kwargs: Passed to the scaler (``init_scale``, ``growth_interval``...).
    """
    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        kwargs.setdefault("device", get_current_device_type()[0])
        return ShardedGradScaler(**kwargs)
    device_type, _ = get_current_device_type()
    if device_type == "cpu" and torch.backends.mps.is_available():
        device_type = "mps"
    return torch.amp.GradScaler(device_type, **kwargs)


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: AutocastKwargs | None = None
) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in the current ``AcceleratorState``'s precision, or a null context.

    Args:
        native_amp: Autocast at all (``False`` gives ``contextlib.nullcontext()``).
        autocast_kwargs: Extra ``torch.autocast`` arguments (``enabled``, ``cache_enabled``).
    """
    from accel.accelerator_state import current_precision_and_device

    if not native_amp:
        return contextlib.nullcontext()
    settings = (autocast_kwargs or AutocastKwargs()).to_kwargs()
    mode, device = current_precision_and_device()
    dtype = autocast_dtype(mode)
    if dtype is None:
        return torch.autocast(device_type=device.type, **settings)
    return torch.autocast(device_type=device.type, dtype=dtype, **settings)


__all__ = ["get_current_device_type", "get_grad_scaler", "get_mixed_precision_context_manager"]
