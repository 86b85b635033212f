"""XLA tensors in checkpoints: no host memory, so they are identified and copied differently.

``torch_xla`` is imported only when an XLA tensor is met (or when the job already imported it).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch


def is_xla(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lives on an XLA device."""
    return tensor.device.type == "xla"


def tensor_identity(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What two state-dict entries share when they are the same tensor (tied weights).

    Host and CUDA tensors: storage address, offset, shape, strides and dtype. XLA tensors have no
    storage address; torch_xla's tensor id is shared by every detached view of one parameter.
    """
    if is_xla(tensor):
        xlac = importlib.import_module("torch_xla")._XLAC
        tensor_id = int(xlac._xla_get_tensor_id(tensor))
        return (tensor.device, "xla-id", tensor_id, tuple(tensor.shape), tensor.dtype)
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def materialize_pending(tensors: Iterable[Any] = ()) -> None:
    """Run the pending XLA graph once, so every XLA tensor is computed before it is copied out.

    Without it each tensor copied to the host would trace, compile and run its own graph. Does
    nothing when the job does not use torch_xla or ``tensors`` holds no XLA tensor.
    """
    if "torch_xla" not in sys.modules:
        return
    if not any(isinstance(item, torch.Tensor) and is_xla(item) for item in tensors):
        return
    torch_xla = sys.modules["torch_xla"]
    sync = getattr(torch_xla, "sync", None)
    if sync is not None:
        sync()
    else:  # torch_xla < 2.6
        importlib.import_module("torch_xla.core.xla_model").mark_step()


def host_copies(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``state_dict`` with its XLA tensors copied to the host (for pickled files)."""
    return {
        name: value.detach().cpu() if isinstance(value, torch.Tensor) and is_xla(value) else value
        for name, value in state_dict.items()
    }
