"""Model helpers: the mixed-precision forward wrapper and unwrapping through every wrapper layer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from accel.kwargs_handlers import AutocastKwargs
from accel.precision import Precision
from accel_ops import convert_to_fp32

_ORIGINAL_FORWARD = "_accel_original_forward"


def patch_forward_for_precision(
    model: torch.nn.Module, precision: Precision, handler: AutocastKwargs | None
) -> None:
    """Make ``model.forward`` run under autocast and return float32 outputs (idempotent)."""
    if precision.autocast_dtype is None or _ORIGINAL_FORWARD in model.__dict__:
        return
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with precision.autocast(handler):
            outputs = original(*args, **kwargs)
        return convert_to_fp32(outputs)

    model.__dict__[_ORIGINAL_FORWARD] = original
    model.forward = forward  # type: ignore[method-assign]


def remove_precision_forward(model: torch.nn.Module) -> None:
    """Undo :func:`patch_forward_for_precision`."""
    original = model.__dict__.pop(_ORIGINAL_FORWARD, None)
    if original is None:
        return
    if getattr(original, "__self__", None) is model and getattr(
        original, "__func__", None
    ) is getattr(type(model), "forward", None):
        model.__dict__.pop("forward", None)
    else:
        model.forward = original  # type: ignore[method-assign]


def unwrap_model(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    unwrappers: Iterable[Callable[[torch.nn.Module], torch.nn.Module | None]] = (),
) -> torch.nn.Module:
    """Peel off ``torch.compile``, DDP/DataParallel and strategy wrappers.

    Args:
        model: A prepared (or plain) model.
        keep_fp32_wrapper: Keep the mixed-precision forward patch; False restores the original.
        unwrappers: Extra functions returning the inner module of a wrapper, or ``None``.
    """
    extra = list(unwrappers)
    while True:
        inner: torch.nn.Module | None = getattr(model, "_orig_mod", None)
        if inner is None and isinstance(
            model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
        ):
            inner = model.module
        for unwrap in extra:
            if inner is None:
                inner = unwrap(model)
        if inner is None or inner is model:
            break
        model = inner
    if not keep_fp32_wrapper:
        remove_precision_forward(model)
    return model
