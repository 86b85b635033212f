"""Regional compilation in place, for models that must keep their own class (FSDP2, DeepSpeed).

:func:`accel.utils.compile_regions` may return a new compiled wrapper; these never do: an FSDP2
model keeps its ``FSDPModule`` class and hooks, a DeepSpeed engine its engine.

Example:
    >>> from accel.utils import compile_regions_fsdp2
    >>> model = compile_regions_fsdp2(model)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch


def _compile_in_place(module: torch.nn.Module, compile_kwargs: dict[str, Any]) -> None:
    blocks = [
        block
        for child in module.modules()
        if isinstance(child, torch.nn.ModuleList)
        for block in child
    ]
    for block in blocks or [module]:
        block.compile(**compile_kwargs)


def compile_regions_fsdp2(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile the repeated blocks of an FSDP2 model in place (the whole model if it has none).

    Args:
        module: The (sharded) model.
        **compile_kwargs: Passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``...).

    Returns:
        ``module`` itself.
    """
    _compile_in_place(module, compile_kwargs)
    return module


def compile_regions_deepspeed(module: torch.nn.Module, **compile_kwargs: Any) -> None:
    """Compile the repeated blocks of a DeepSpeed engine's model in place.

    Args:
        module: A DeepSpeed engine or plain module (an engine's ``.module`` is compiled).
        **compile_kwargs: Passed to ``torch.compile``.
    """
    inner = getattr(module, "module", module)
    _compile_in_place(inner, compile_kwargs)


__all__ = ["compile_regions_deepspeed", "compile_regions_fsdp2"]
