"""Questions about a model's parallel layout: DTensor parameters, tensor-parallel degree.

Example:
    >>> import torch
    >>> from accel.utils import get_model_tp_size, model_has_dtensor
    >>> model_has_dtensor(torch.nn.Linear(2, 2)), get_model_tp_size(torch.nn.Linear(2, 2))
    (False, None)
"""

from __future__ import annotations

from typing import Any

import torch

from accel_state.torch_compat import is_dtensor


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (FSDP2, tensor parallel)."""
    return any(is_dtensor(parameter) for parameter in model.parameters())


def get_model_tp_size(model: torch.nn.Module) -> int | None:
    """The tensor-parallel degree a transformers model was loaded with, else ``None``.

    Read from ``model.tp_size`` (transformers < 5) or ``model.config.distributed_config``.
    """
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return int(tp_size)
    distributed: Any = getattr(getattr(model, "config", None), "distributed_config", None)
    value = (
        distributed.get("tp_size")
        if isinstance(distributed, dict)
        else getattr(distributed, "tp_size", None)
    )
    return None if value is None else int(value)


__all__ = ["get_model_tp_size", "model_has_dtensor"]
