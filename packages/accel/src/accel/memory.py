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
    " out of memory.",  # CUDA, HIP (ROCm), XPU: "<device> out of memory. Tried to allocate..."
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # Gaudi (HPU)
)


def release_memory(*objects: Any) -> list[Any]:
    """Drop the given references, collect garbage and empty device caches.

    Use as ``model, optimizer = release_memory(model, optimizer)``.

    Returns:
        A list of ``None`` of the same length, to rebind the caller's names.
    """
    count = len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return [None] * count


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return cached blocks of every accelerator to the driver.

    Args:
        garbage_collection: Run ``gc.collect()`` first, so blocks held only by unreachable
            objects are freed too (slow: use sparingly, as Accelerate says).
    """
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        xpu.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        mps.empty_cache()


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` means the device ran out of memory (so a smaller batch may fit).

    True for ``torch.OutOfMemoryError`` and for ``RuntimeError`` messages of CUDA, HIP (ROCm),
    XPU, MPS and Gaudi out-of-memory, the CPU allocator's failure, and cuDNN's "not supported".
    """
    if isinstance(exception, torch.cuda.OutOfMemoryError):
        return True
    return (
        isinstance(exception, RuntimeError)
        and len(exception.args) == 1
        and isinstance(exception.args[0], str)
        and any(message in exception.args[0] for message in _OUT_OF_MEMORY_MESSAGES)
    )


def find_executable_batch_size(
    function: Callable[..., R] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, ...)``, with a smaller batch after each out-of-memory.

    The decorated function takes ``batch_size`` as its first parameter; callers do not pass it.
    After an out-of-memory error (see :func:`should_reduce_batch_size`) the batch size becomes
    ``int(batch_size * 0.9)`` (128, 115, 103, 92...), or ``reduce_batch_size_fn()``. The size
    that last ran is remembered: the next call of the decorated function starts from it.

    Args:
        function: The function to wrap (omit it to get a decorator with these settings).
        starting_batch_size: The first batch size tried.
        reduce_batch_size_fn: Called with no arguments after each out-of-memory error; returns
            the next batch size to try.

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
    target = function
    batch_size = starting_batch_size

    def reduce() -> int:
        if reduce_batch_size_fn is not None:
            return reduce_batch_size_fn()
        return int(batch_size * 0.9)

    @functools.wraps(target)
    def run(*args: Any, **kwargs: Any) -> R:
        nonlocal batch_size
        parameters = list(inspect.signature(target).parameters)
        if len(parameters) < len(args) + 1:
            names = ", ".join(
                f"{name}={value!r}" for name, value in zip(parameters[1:], args, strict=False)
            )
            raise TypeError(
                f"{target.__name__}() got its batch size from find_executable_batch_size; call it "
                f"without the first argument (got {names or 'extra positional arguments'})."
            )
        clear_device_cache(garbage_collection=True)
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    f"find_executable_batch_size: no batch size from {starting_batch_size} down "
                    f"to 1 fits (reached {batch_size})."
                )
            try:
                return target(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                clear_device_cache(garbage_collection=True)
                batch_size = reduce()

    return run
