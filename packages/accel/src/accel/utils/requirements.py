"""Decorators that refuse a call early when what it needs is missing (Accelerate's names).

Example:
    >>> from accel.utils import torchao_required
    >>> @torchao_required
    ... def convert(model): ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.utils.imports import is_torchao_available

F = TypeVar("F", bound=Callable[..., Any])


def torchao_required(func: F) -> F:
    """Make ``func`` raise, naming the install, when torchao is not installed.

    Raises:
        UnsupportedFeatureError: (when called) torchao is missing.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise UnsupportedFeatureError(
                f"{func.__name__} needs torchao, which is not installed: "
                "pip install 'accel[fp8]' (or pip install torchao)."
            )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def deepspeed_required(func: F) -> F:
    """Make ``func`` raise when an Accelerator exists that is not set up for DeepSpeed.

    Raises:
        AcceleratorConfigError: (when called) the current ``AcceleratorState`` is not DeepSpeed.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from accel.state import AcceleratorState
        from accel_state import DistributedType

        if AcceleratorState._shared_state:
            kind = AcceleratorState().distributed_type
            if kind != DistributedType.DEEPSPEED:
                raise AcceleratorConfigError(
                    f"{func.__name__} needs DeepSpeed, but the Accelerator runs {kind}: "
                    "create it with deepspeed_plugin=... (or accel launch --use_deepspeed) "
                    "before calling it."
                )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = ["deepspeed_required", "torchao_required"]
