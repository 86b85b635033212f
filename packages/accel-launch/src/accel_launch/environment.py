"""Helpers over environment variables: writing them out safely and undoing what code set.

Example:
    >>> with clear_environment():
    ...     len(os.environ)
    0
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

#: Prefixes of the variables :func:`purge_accelerate_environment` restores: Accelerate's and accel's.
PURGED_PREFIXES = ("ACCELERATE_", "ACCEL_")
_FORBIDDEN = (";", "\n", "<", ">", " ")
_WRAPPED = "_accel_purged_environment"

T = TypeVar("T")


def convert_dict_to_env_variables(
    current_env: Mapping[str, str], *, log: logging.Logger | None = None
) -> list[str]:
    """Turn ``{"A": "1"}`` into the lines ``A=1`` of an environment file (DeepSpeed's ``.deepspeed_env``).

    Entries with an empty key or value, or a character that would break such a file (``;``, a
    newline, ``<``, ``>``, a space), are left out with a warning naming them, on ``log`` (this
    module's logger unless given).
    """
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and value and not any(char in text for char in _FORBIDDEN):
            lines.append(f"{key}={value}\n")
        else:
            (log or logger).warning(
                "Skipping %s=%s: empty, or holds one of ; < > space or a newline", key, value
            )
    return lines


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the environment is restored afterwards.

    Accelerate's ``accelerate.utils.clear_environment``.
    """
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _restored_environment() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(PURGED_PREFIXES)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(PURGED_PREFIXES)]:
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]
        os.environ.update(before)  # the ones the code deleted


def _wrap(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _restored_environment():
            return func(*args, **kwargs)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _wrap_test_methods(cls: type) -> None:
    for name in dir(cls):
        if name.startswith("test"):
            method = getattr(cls, name)
            if callable(method) and not getattr(method, _WRAPPED, False):
                setattr(cls, name, _wrap(method))


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Put back the ``ACCELERATE_*`` / ``ACCEL_*`` variables a function or test class changes.

    Decorates a function, or every ``test*`` method of a class and of its subclasses.

    For tests: code such as ``TrainingArguments(fp16=True)`` sets ``ACCELERATE_MIXED_PRECISION``,
    which would otherwise leak into the next test.
    """
    if not isinstance(func_or_cls, type):
        return _wrap(func_or_cls)  # type: ignore[arg-type, return-value]
    _wrap_test_methods(func_or_cls)
    original = func_or_cls.__dict__.get("__init_subclass__")

    def init_subclass(sub: type, **kwargs: Any) -> None:
        if isinstance(original, classmethod):
            original.__func__(sub, **kwargs)
        _wrap_test_methods(sub)

    func_or_cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment, arg-type]
    return func_or_cls
