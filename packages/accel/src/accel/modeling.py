"""Model helpers: the mixed-precision forward wrapper and unwrapping through every wrapper layer.

Accelerate's ``extract_model_from_parallel`` and ``is_peft_model`` (``accelerate.utils``) unwrap
here too.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(2, 2)
    >>> extract_model_from_parallel(torch.nn.DataParallel(layer)) is layer
    True
"""

from __future__ import annotations

import functools
import importlib.util
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
    """Undo :func:`patch_forward_for_precision`.

    A forward that the user (or transformers) wrapped after saving the original as
    ``model._original_forward`` (Accelerate's convention) is restored from it too.
    """
    original = model.__dict__.pop(_ORIGINAL_FORWARD, None)
    if original is None:
        original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    _reinstate_forward(model, original)


def _reinstate_forward(model: torch.nn.Module, forward: Callable[..., Any]) -> None:
    """Make ``forward`` the model's forward; the class's own is restored by dropping the override."""
    if getattr(forward, "__self__", None) is model and getattr(
        forward, "__func__", None
    ) is getattr(type(model), "forward", None):
        model.__dict__.pop("forward", None)
    else:
        model.forward = forward  # type: ignore[method-assign]


Unwrapper = Callable[[torch.nn.Module], torch.nn.Module | None]


def _inner_module(
    model: torch.nn.Module, unwrappers: Iterable[Unwrapper]
) -> torch.nn.Module | None:
    """The module directly inside ``model`` when it is a wrapper, else ``None``."""
    inner: torch.nn.Module | None = getattr(model, "_orig_mod", None)
    if inner is None and isinstance(
        model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    ):
        inner = model.module
    for unwrap in unwrappers:
        if inner is None:
            inner = unwrap(model)
    return None if inner is model else inner


def _unwrap_children(module: torch.nn.Module, unwrappers: list[Unwrapper]) -> torch.nn.Module:
    """``module`` without wrappers, its children (recursively) replaced by their inner modules."""
    while True:
        inner = _inner_module(module, unwrappers)
        if inner is None:
            wrapped = getattr(module, "module", None)  # FSDP/XLA-style wrappers of sub-layers
            inner = wrapped if isinstance(wrapped, torch.nn.Module) else None
        if inner is None:
            break
        module = inner
    for name, child in list(module.named_children()):
        unwrapped = _unwrap_children(child, unwrappers)
        if unwrapped is not child:
            setattr(module, name, unwrapped)
    return module


def _keep_compiled(compiled: torch.nn.Module, inner: torch.nn.Module) -> torch.nn.Module:
    """``compiled`` when it wraps ``inner`` directly, else a compiled wrapper of ``inner``.

    The new wrapper reuses the compiled module's dynamo context (backend and options); the
    prepared model is left as it was.
    """
    if getattr(compiled, "_orig_mod", None) is inner:
        return compiled
    context = getattr(compiled, "dynamo_ctx", None)
    if context is None:
        return inner
    return type(compiled)(inner, context)  # type: ignore[call-arg]


def unwrap_model(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    unwrappers: Iterable[Unwrapper] = (),
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """Peel off DDP/DataParallel, strategy and (unless kept) ``torch.compile`` wrappers.

    Args:
        model: A prepared (or plain) model.
        keep_fp32_wrapper: Keep the mixed-precision forward patch; False restores the original.
        unwrappers: Extra functions returning the inner module of a wrapper, or ``None``.
        keep_torch_compile: Return the model still compiled (as Accelerate does by default): the
            outermost ``torch.compile`` wrapper around the unwrapped model. False returns the
            plain module.
        recursive: Also replace wrapped sub-modules (any child with a ``module`` sub-module,
            as FSDP wraps layers) by their inner modules, in place.
    """
    extra = list(unwrappers)
    compiled: torch.nn.Module | None = None
    inner = _inner_module(model, extra)
    while inner is not None:
        if compiled is None and getattr(model, "_orig_mod", None) is inner:
            compiled = model
        model = inner
        inner = _inner_module(model, extra)
    if recursive:
        model = _unwrap_children(model, extra)
    if not keep_fp32_wrapper:
        remove_precision_forward(model)
    if keep_torch_compile and compiled is not None:
        return _keep_compiled(compiled, model)
    return model


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The user's model inside DDP / DataParallel (and, unless kept, ``torch.compile``) wrappers.

    Args:
        model: The model to extract.
        keep_fp32_wrapper: Keep the mixed-precision forward patch.
        keep_torch_compile: Return it still compiled when it was (Accelerate's default).
        recursive: Also unwrap wrapped sub-modules, in place.
    """
    unwrapped = unwrap_model(
        model,
        keep_fp32_wrapper=keep_fp32_wrapper,
        keep_torch_compile=keep_torch_compile,
        recursive=recursive,
    )
    if not keep_fp32_wrapper:
        _restore_original_forward(getattr(unwrapped, "_orig_mod", unwrapped))
    return unwrapped


def _restore_original_forward(model: torch.nn.Module) -> None:
    """Undo a forward wrapped by hand with ``model._original_forward`` recorded (Accelerate's way).

    The wrappers (``functools.wraps`` chains, ``__wrapped__``) are peeled until the recorded
    forward; the class's own forward is restored by dropping the instance attribute.
    """
    original = model.__dict__.pop("_original_forward", None)
    if original is None:
        return
    forward = model.__dict__.get("forward", original)
    while hasattr(forward, "__wrapped__") and forward != original:
        forward = forward.__wrapped__
    _reinstate_forward(model, forward)


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (inside DDP / compile wrappers) is a PEFT ``PeftModel``.

    ``False`` when peft is not installed (it is never imported otherwise).
    """
    if importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(extract_model_from_parallel(model), PeftModel)
