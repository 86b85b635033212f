"""What the FSDP functions share: plugin resolution, refusals, selecting modules by regex."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.modeling import is_peft_model
from accel.strategies.fsdp.plugin import FSDPSettings, FullyShardedDataParallelPlugin

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
    return bool(adapter_only) and is_peft_model(model)


def get_parameters_from_modules(
    modules: Iterable[torch.nn.Module] | str | None, model: torch.nn.Module, device: Any
) -> set[torch.nn.Parameter]:
    """The parameters of ``modules``: modules, or a regex matched in full against module names.

    Modules a regex selects are moved to ``device`` (see :func:`select_modules`).

    Args:
        modules: Modules, a regular expression over ``model.named_modules()`` names, or ``None``.
        model: The model the names refer to.
        device: Where regex-selected modules go.
    """
    return {
        parameter
        for module in select_modules(modules, model, device)
        for parameter in module.parameters()
    }


def select_modules(
    modules: Iterable[torch.nn.Module] | str | None, model: torch.nn.Module, device: Any
) -> list[torch.nn.Module]:
    """``modules`` as a list: modules as given, or a regex matched in full against module names.

    Modules a regex selects are moved to ``device`` (FSDP leaves ignored modules unsharded, so
    they must already sit where the model computes).

    Args:
        modules: Modules, a regular expression over ``model.named_modules()`` names, or ``None``.
        model: The model the names refer to.
        device: Where regex-selected modules go.
    """
    if modules is None:
        return []
    if isinstance(modules, str):
        pattern = re.compile(modules)
        selected = [module for name, module in model.named_modules() if pattern.fullmatch(name)]
        for module in selected:
            module.to(device)
        return selected
    return list(modules)


__all__ = [
    "PathLike",
    "adapter_weights_only",
    "get_parameters_from_modules",
    "resolve_plugin",
    "select_modules",
]
