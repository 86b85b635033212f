"""Hide and show the terminal cursor (ANSI escape codes)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hide", "hide_cursor", "show_cursor"]


def hide_cursor() -> None:
    """Hide the cursor of the terminal on stdout."""
    sys.stdout.write("\033[?25l")
    sys.stdout.flush()


def show_cursor() -> None:
    """Show the cursor again."""
    sys.stdout.write("\033[?25h")
    sys.stdout.flush()


@contextmanager
def hide() -> Iterator[None]:
    """Hide the cursor for the ``with`` block (shown again even when the block raises)."""
    try:
        hide_cursor()
        yield
    finally:
        show_cursor()
