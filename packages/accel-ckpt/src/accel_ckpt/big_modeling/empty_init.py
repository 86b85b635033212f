"""Building models without allocating their weights: parameters land on the meta device.

Inside :func:`init_empty_weights` every parameter a module registers is moved to ``meta`` the
moment it is registered, so the following ``reset_parameters()`` touches nothing and a model of
any size costs a few kilobytes of Python objects. Buffers stay real unless
``include_buffers=True`` (position ids and masks are small and often never saved).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

_LOCK = threading.RLock()
_FACTORIES = ("empty", "zeros", "ones", "full")


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Create modules with their parameters (and optionally buffers) on the meta device.

    Example:
        >>> with init_empty_weights():
        ...     model = nn.Linear(100_000, 100_000)  # no memory is allocated
        >>> model.weight.device
        device(type='meta')

    Args:
        include_buffers: Also put buffers (and tensors made by ``torch.empty``/``zeros``/
            ``ones``/``full`` without a device) on the meta device. Default ``False``.

    """
    with init_on_device(torch.device("meta"), include_buffers=bool(include_buffers)):
        yield


@contextlib.contextmanager
def init_on_device(
    device: torch.device | str | int, include_buffers: bool | None = None
) -> Iterator[None]:
    """Create every parameter (and optionally buffer) of new modules directly on ``device``.

    Args:
        device: Where parameters go (``"meta"`` allocates nothing).
        include_buffers: Create every tensor made without an explicit device there (buffers
            included), through torch's device context manager.

    """
    target = torch.device(device)
    include = bool(include_buffers)
    if include:
        # Everything created without an explicit device lands on ``target``: torch's device
        # context does it (nn.Module's methods stay as they are).
        with _LOCK, target:
            yield
        return
    with _LOCK:
        original_parameter = nn.Module.register_parameter
        original_buffer = nn.Module.register_buffer

        def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
            original_parameter(module, name, param)
            current = module._parameters.get(name)
            if current is not None and current.device != target:
                kwargs = dict(current.__dict__)
                moved = type(current)(current.to(target), requires_grad=current.requires_grad)
                moved.__dict__.update(kwargs)
                module._parameters[name] = moved

        def register_buffer(
            module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
        ) -> None:
            original_buffer(module, name, tensor, persistent=persistent)
            current = module._buffers.get(name)
            if current is not None and current.device != target:
                module._buffers[name] = current.to(target)

        patched: dict[str, Callable[..., Any]] = {}
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign,assignment]
        if include:
            nn.Module.register_buffer = register_buffer  # type: ignore[method-assign,assignment]
            for factory in _FACTORIES:
                patched[factory] = getattr(torch, factory)
                setattr(torch, factory, _on_device(patched[factory], target))
        try:
            yield
        finally:
            nn.Module.register_parameter = original_parameter  # type: ignore[method-assign,assignment]
            nn.Module.register_buffer = original_buffer  # type: ignore[method-assign,assignment]
            for factory, function in patched.items():
                setattr(torch, factory, function)


def _on_device(function: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device") is None:
            kwargs["device"] = device
        return function(*args, **kwargs)

    return wrapper
