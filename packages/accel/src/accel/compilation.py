"""``torch.compile`` of prepared models, whole or region by region (``TorchDynamoPlugin``)."""

from __future__ import annotations

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
