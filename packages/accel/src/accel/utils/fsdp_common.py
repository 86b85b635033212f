"""What the free-standing FSDP save/load functions share: plugin resolution, refusals."""

from __future__ import annotations

import os
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.fsdp_plugin import FSDPSettings, FullyShardedDataParallelPlugin

PathLike = str | os.PathLike[str]


def resolve_plugin(fsdp_plugin: Any, accelerator: Any) -> FSDPSettings:
    """The plugin's settings merged with the launcher's (checks it is an accel plugin).

    Raises:
        AcceleratorConfigError: ``fsdp_plugin`` is not a ``FullyShardedDataParallelPlugin``.
    """
    if not isinstance(fsdp_plugin, FullyShardedDataParallelPlugin):
        raise AcceleratorConfigError(
            f"fsdp_plugin={fsdp_plugin!r}: pass the accel.FullyShardedDataParallelPlugin the "
            "Accelerator was made with (accelerator.state.fsdp_plugin)."
        )
    return fsdp_plugin.resolved(accelerator.state.partial.contract.fsdp_config)


def adapter_weights_only(adapter_only: bool, model: torch.nn.Module) -> bool:
    """Whether to save or load only the adapter weights, as Accelerate decides.

    ``adapter_only=True`` applies to PEFT models: their trainable (adapter) parameters are
    written and read, the frozen base weights are not. For any other model it is ignored
    (transformers' Trainer passes ``adapter_only=True`` for every model).
    """
    from accel.utils.modeling import is_peft_model

    return bool(adapter_only) and is_peft_model(model)


__all__ = ["PathLike", "adapter_weights_only", "resolve_plugin"]
