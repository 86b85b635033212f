"""Byte sizes: read from ``"10GB"``, ``"10GiB"``, ``"5Gb"`` (bits) or ints; written for humans."""

from __future__ import annotations

import re

from accel_ckpt.errors import InvalidArgumentError

_DECIMAL = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BINARY = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(size: int | str, argument: str = "max_shard_size", allow_zero: bool = False) -> int:
    """Convert a size to bytes.

    ``KB/MB/GB/TB`` are powers of 1000 and ``KiB/MiB/GiB/TiB`` powers of 1024; a lower-case
    trailing ``b`` (``"5Gb"``) means bits, as in Accelerate. A bare number is bytes.

    Args:
        size: An int (bytes) or a string such as ``"10GB"``.
        argument: The argument's name, for the error messages.
        allow_zero: Accept zero bytes (``"0MB"``).

    Returns:
        The size in bytes.

    Raises:
        InvalidArgumentError: The value is negative or not a size.

    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise InvalidArgumentError(
            f"{argument}={size!r} is not a size; pass an int (bytes) or a string like '10GB'."
        )
    if isinstance(size, int):
        if size < 0 or (size == 0 and not allow_zero):
            raise InvalidArgumentError(f"{argument}={size} must be a positive number of bytes.")
        return size
    match = _PATTERN.match(size)
    if match is None:
        raise InvalidArgumentError(
            f"{argument}={size!r} is not a size; use e.g. '200KB', '1GB', '10GiB' or an int."
        )
    number, unit = float(match.group(1)), match.group(2)
    bits = len(unit) > 1 and unit.endswith("b") and not unit.upper().endswith("IB")
    key = unit.upper() if unit else "B"
    factor = _DECIMAL.get(key) or _BINARY.get(key)
    if factor is None:
        raise InvalidArgumentError(
            f"{argument}={size!r} has unknown unit {unit!r}; "
            f"use one of {sorted(_DECIMAL)} or {['KiB', 'MiB', 'GiB', 'TiB']}."
        )
    value = int(number * factor)
    if bits:
        value //= 8
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgumentError(f"{argument}={size!r} must be at least one byte.")
    return value


def format_size(num_bytes: int) -> str:
    """Render a byte count for messages, e.g. ``1.50 GB``."""
    value = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    return f"{value:.2f} TB"


def convert_bytes(size: float) -> str:
    """A byte count for humans in powers of 1024, as Accelerate writes it: ``"2.0 KB"``.

    Accelerate's ``accelerate.utils.convert_bytes`` (:func:`format_size` is accel's own, in
    powers of 1000).
    """
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"
