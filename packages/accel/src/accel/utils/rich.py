"""Accelerate's ``accelerate.utils.rich``: importing it installs rich's traceback printer.

Raises:
    ModuleNotFoundError: rich is not installed (``pip install rich``).
"""

from __future__ import annotations

from accel.utils.imports import is_rich_available

if not is_rich_available():
    raise ModuleNotFoundError(
        "accel.utils.rich installs rich's traceback printer; install rich with `pip install rich`.",
        name="rich",
    )

from rich.traceback import install

install(show_locals=False)
