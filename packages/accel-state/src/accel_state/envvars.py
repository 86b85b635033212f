"""Small, strict readers of environment variables, and a context manager to patch them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal, overload

from accel_state.errors import EnvironmentConfigError

_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off", ""}


@overload
def str_to_bool(value: str, to_bool: Literal[True], *, name: str = "value") -> bool: ...


@overload
def str_to_bool(value: str, to_bool: Literal[False] = False, *, name: str = "value") -> int: ...


@overload
def str_to_bool(value: str, to_bool: bool = False, *, name: str = "value") -> int | bool: ...


def str_to_bool(value: str, to_bool: bool = False, *, name: str = "value") -> int | bool:
    """Parse a boolean written as 1/0, true/false, yes/no or on/off (any case).

    As Accelerate's, it returns ``1`` or ``0`` unless ``to_bool=True`` asks for ``True``/``False``.

    Args:
        value: The text to parse.
        to_bool: Return a ``bool`` instead of ``1``/``0``.
        name: What the text is, for the error message (usually the variable name).

    Raises:
        EnvironmentConfigError: When the text is none of the accepted spellings.

    """
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise EnvironmentConfigError(
        f"{name}={value!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off."
    )


def read_int(
    environ: Mapping[str, str], name: str, default: int | None = None, minimum: int | None = None
) -> int:
    """Read an integer variable.

    Args:
        environ: The environment to read.
        name: Variable name.
        default: Value when the variable is absent; ``None`` makes it required.
        minimum: Smallest accepted value.

    Raises:
        EnvironmentConfigError: When the variable is missing (and required), not an integer, or too small.

    """
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise EnvironmentConfigError(f"{name} is not set; it must be set to an integer.")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise EnvironmentConfigError(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise EnvironmentConfigError(f"{name}={raw!r} must be >= {minimum}.")
    return value


def read_bool(environ: Mapping[str, str], name: str, default: bool = False) -> bool:
    """Read a boolean variable, ``default`` when absent."""
    raw = environ.get(name)
    if raw is None:
        return default
    return str_to_bool(raw, True, name=name)


def read_choice(environ: Mapping[str, str], name: str, choices: list[str], default: str) -> str:
    """Read a variable restricted to ``choices`` (compared lower-case)."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise EnvironmentConfigError(
            f"{name}={raw!r} is not valid; choose one of {', '.join(choices)}."
        )
    return value


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (upper-cased names, values turned to ``str``) for a block.

    Variables that existed before are restored afterwards, new ones removed. A value of ``None``
    removes the variable for the duration of the block.

    Example:
        >>> with patch_environment(master_port="29501"):
        ...     pass

    """
    saved: dict[str, str | None] = {}
    for key, value in kwargs.items():
        name = key.upper()
        saved[name] = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = previous
