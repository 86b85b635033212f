"""``torch.compile`` of prepared models, whole or region by region (``TorchDynamoPlugin``)."""

from __future__ import annotations

from typing import Any

import torch

from accel.kwargs_handlers import TorchDynamoPlugin


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """Compile ``model`` as ``plugin`` says; returns it unchanged when compilation is off.

    With ``use_regional_compilation`` every entry of each ``nn.ModuleList`` (the repeated blocks
    of a transformer) is compiled in place and the rest of the model stays eager; a model without such blocks is compiled whole.
    """
    if not plugin.enabled:
        return model
    kwargs = plugin.compile_kwargs()
    if plugin.use_regional_compilation:
        blocks = [
            block
            for module in model.modules()
            if isinstance(module, torch.nn.ModuleList)
            for block in module
        ]
        if blocks:
            for block in blocks:
                block.compile(**kwargs)
            return model
    return torch.compile(model, **kwargs)  # type: ignore[return-value]


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile the repeated blocks of ``module`` in place (the whole module if it has none)."""
    plugin = TorchDynamoPlugin(
        backend=compile_kwargs.pop("backend", "inductor"), use_regional_compilation=True
    )
    for name, value in compile_kwargs.items():
        setattr(plugin, name, value)
    return compile_model(module, plugin)


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether any submodule of ``module`` was compiled in place (``module.compile()``)."""
    return any(getattr(sub, "_compiled_call_impl", None) is not None for sub in module.modules())
