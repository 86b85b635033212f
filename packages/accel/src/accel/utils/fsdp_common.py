"""What the free-standing FSDP save/load functions share: plugin resolution, refusals."""

from __future__ import annotations

import os
from typing import Any

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
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


def refuse_adapter_only(adapter_only: bool) -> None:
    """Refuse PEFT adapter-only saving and loading.

    Raises:
        UnsupportedFeatureError: ``adapter_only`` is true.
    """
    if adapter_only:
        raise UnsupportedFeatureError(
            "adapter_only=True saves PEFT adapter weights, which accel does not handle; save the "
            "whole model (adapter_only=False) or use PEFT's own save_pretrained."
        )


__all__ = ["PathLike", "refuse_adapter_only", "resolve_plugin"]
