"""``torch.compile`` of prepared models, whole or region by region (``TorchDynamoPlugin``)."""

from __future__ import annotations

import types
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


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an ``nn.ModuleList`` of blocks all of the first block's class."""
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and all(isinstance(block, type(module[0])) for block in module)
    )


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether ``module`` or any module inside it is a list of repeated blocks."""
    return any(is_repeated_blocks(sub) for sub in module.modules())


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """A twin of ``module`` whose repeated blocks are compiled one by one; ``module`` is untouched.

    Each block of a repeated ``nn.ModuleList`` is wrapped by ``torch.compile`` (blocks of the same
    class hit the compiler's cache), the other parts without repeated blocks are compiled whole,
    and the modules between are shallow copies sharing parameters and buffers with ``module``.
    Methods bound to ``module`` in its ``__dict__`` are rebound to the twin. The twin keeps
    ``module`` as ``_orig_mod``, so unwrapping without ``torch.compile`` gives ``module`` back.

    Args:
        module: The model.
        **compile_kwargs: Passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``...).
    """
    twin = _compile_regions(module, compile_kwargs)
    if "_orig_mod" not in twin.__dict__:
        twin.__dict__["_orig_mod"] = module
    return twin


def _compile_regions(module: torch.nn.Module, compile_kwargs: dict[str, Any]) -> torch.nn.Module:
    if is_repeated_blocks(module):
        blocks = list(module.children())
        return torch.nn.ModuleList(
            [torch.compile(block, **compile_kwargs) for block in blocks]  # type: ignore[misc]
        )
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)  # type: ignore[return-value]
    twin = type(module).__new__(type(module))
    twin.__dict__.update(module.__dict__)
    for name, value in list(twin.__dict__.items()):
        if getattr(value, "__self__", None) is module and hasattr(value, "__func__"):
            twin.__dict__[name] = types.MethodType(value.__func__, twin)
    twin._modules = {}
    for name, child in module.named_children():
        twin.add_module(name, _compile_regions(child, compile_kwargs))
    return twin


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether a submodule of ``module`` is compiled.

    Wrapped by ``torch.compile`` (as :func:`compile_regions` does) or compiled in place
    (``module.compile()``, as regional compilation at ``prepare`` does).
    """
    optimized = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    wrapper = getattr(optimized, "OptimizedModule", None)
    return any(
        (wrapper is not None and isinstance(sub, wrapper))
        or getattr(sub, "_compiled_call_impl", None) is not None
        for sub in module.modules()
    )
