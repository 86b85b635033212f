"""Layerwise casting: weights stored in a small dtype, cast up for each layer's forward.

Example:
    >>> import torch
    >>> from accel_ckpt.big_modeling.casting import attach_layerwise_casting_hooks
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    >>> attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
    >>> model[0].weight.dtype
    torch.bfloat16
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from accel_ckpt.big_modeling.hooks import ModelHook, add_hook_to_module

# Accelerate logs these from ``accelerate.big_modeling``; accel's twin is ``accel.big_modeling``.
logger = logging.getLogger("accel.big_modeling")

#: The layer classes whose weights are cast (Accelerate's ``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING``).
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)


class LayerwiseCastingHook(ModelHook):
    """Keep a module's weights in ``storage_dtype``; cast them to ``compute_dtype`` for forward.

    Args:
        storage_dtype: The dtype between calls (``torch.float8_e4m3fn``, ``torch.bfloat16``...).
        compute_dtype: The dtype during the forward.
        non_blocking: Cast asynchronously.
    """

    _is_stateful = False

    def __init__(
        self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool
    ) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Cast the module to the storage dtype."""
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Cast the module up to the compute dtype."""
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Cast the module back down to the storage dtype."""
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | Sequence[str] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Hook every supported layer (Linear, Conv*) of ``module`` with a :class:`LayerwiseCastingHook`.

    Args:
        module: The model (or a supported layer itself).
        storage_dtype: The dtype the weights are kept in.
        compute_dtype: The dtype they are cast to for each forward.
        skip_modules_pattern: Regular expressions; modules whose dotted name matches one keep
            their dtype.
        skip_modules_classes: Module classes that keep their dtype.
        non_blocking: Cast asynchronously.
    """
    _attach_layerwise_casting_hooks(
        module,
        storage_dtype,
        compute_dtype,
        skip_modules_pattern,
        skip_modules_classes,
        non_blocking,
    )


def _attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | Sequence[str] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
    _prefix: str = "",
) -> None:
    patterns = (
        [skip_modules_pattern] if isinstance(skip_modules_pattern, str) else skip_modules_pattern
    )
    skip = (skip_modules_classes is not None and isinstance(module, skip_modules_classes)) or (
        patterns is not None and any(re.search(pattern, _prefix) for pattern in patterns)
    )
    if skip:
        logger.debug('Skipping layerwise casting for layer "%s"', _prefix)
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        logger.debug('Applying layerwise casting to layer "%s"', _prefix)
        hook = LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking)
        add_hook_to_module(module, hook, append=True)
        return
    for name, child in module.named_children():
        _attach_layerwise_casting_hooks(
            child,
            storage_dtype,
            compute_dtype,
            patterns,
            skip_modules_classes,
            non_blocking,
            _prefix=f"{_prefix}.{name}" if _prefix else name,
        )


def _refuse_recurrent_layers_under_sequence_parallelism(model: nn.Module) -> None:
    """Refuse a model with linear-attention (recurrent) layers under sequence parallelism.

    Those layers carry a state along the sequence outside the attention interface that Ulysses
    wraps, so sharding the sequence would silently give wrong gradients.

    Raises:
        ValueError: The model's (text) config lists ``*linear_attention*`` layer types.
    """
    config: Any = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    recurrent = sorted({kind for kind in layer_types if "linear_attention" in kind})
    if recurrent:
        raise ValueError(
            f"Sequence parallelism does not support attention layers of type {recurrent} (model "
            f"{type(model).__name__}). Those layers carry a recurrent state along the sequence "
            "and bypass the attention interface, so sharding the sequence restarts the state on "
            "every rank and produces wrong gradients without failing. Use a full-attention "
            "model, or disable sequence parallelism."
        )
