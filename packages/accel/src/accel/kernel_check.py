"""Accelerate's check for Linux kernels old enough to hang distributed processes.

Example:
    >>> check_os_kernel()  # logs a warning on kernels older than 5.5; nothing otherwise
"""

from __future__ import annotations

import logging
import platform
import re

_MIN_KERNEL = (5, 5)
# Accelerate logs it on ``accelerate.utils.other``, where it defines the check.
_LOGGER = logging.getLogger("accel.utils.other")


def check_os_kernel() -> None:
    """Log a warning on Linux kernels older than 5.5, where processes can hang (as Accelerate does)."""
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is None:
        return
    version = found.group(0)
    if tuple(int(part) for part in version.split(".")[:2]) < _MIN_KERNEL:
        _LOGGER.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of 5.5.0; "
            "this can cause the process to hang. Upgrade the kernel to 5.5.0 or newer."
        )
