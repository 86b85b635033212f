"""Releasing device memory, and retrying a function with smaller batches when memory runs out."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

R = TypeVar("R")

_OUT_OF_MEMORY_MESSAGES = (
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "XPU out of memory.",
    "MPS backend out of memory",
)


def release_memory(*objects: Any) -> list[Any]:
    """Drop the given references, collect garbage and empty device caches.

    Use as ``model, optimizer = release_memory(model, optimizer)``.

    Returns:
        A list of ``None`` of the same length, to rebind the caller's names.
    """
    count = len(objects)
    del objects
    clear_device_cache()
    return [None] * count


def clear_device_cache() -> None:
    """Collect garbage and return cached blocks of every accelerator to the driver."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        xpu.empty_cache()


def should_reduce_batch_size(error: BaseException) -> bool:
    """Whether ``error`` means the device ran out of memory."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    return (
        isinstance(error, RuntimeError)
        and len(error.args) == 1
        and any(message in str(error.args[0]) for message in _OUT_OF_MEMORY_MESSAGES)
    )


def find_executable_batch_size(
    function: Callable[..., R] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[int], int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, ...)``, halving ``batch_size`` after each out-of-memory.

    The decorated function takes ``batch_size`` as its first parameter; callers do not pass it.

    Example:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size, model):
        ...     ...
        >>> train(model)

    Raises:
        TypeError: The caller passed a value for ``batch_size`` too.
        RuntimeError: The batch size reached zero without a run that fits.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    reduce = reduce_batch_size_fn or (lambda size: size // 2)
    target = function

    @functools.wraps(target)
    def run(*args: Any, **kwargs: Any) -> R:
        parameters = list(inspect.signature(target).parameters)
        if len(parameters) < len(args) + 1:
            names = ", ".join(
                f"{name}={value!r}" for name, value in zip(parameters[1:], args, strict=False)
            )
            raise TypeError(
                f"{target.__name__}() got its batch size from find_executable_batch_size; call it "
                f"without the first argument (got {names or 'extra positional arguments'})."
            )
        batch_size = starting_batch_size
        clear_device_cache()
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    f"find_executable_batch_size: no batch size from {starting_batch_size} down to 1 fits."
                )
            try:
                return target(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                clear_device_cache()
                batch_size = reduce(batch_size)

    return run
