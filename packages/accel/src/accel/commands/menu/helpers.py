"""Writing to the terminal: colours, cursor moves, clearing lines (ANSI escape codes)."""

from __future__ import annotations

import enum
import shutil
import sys

TERMINAL_WIDTH = shutil.get_terminal_size(fallback=(80, 24)).columns
#: A direction and the final letter of its ANSI cursor-move sequence.
CURSOR_TO_CHAR = {"UP": "A", "DOWN": "B", "RIGHT": "C", "LEFT": "D"}

__all__ = [
    "CURSOR_TO_CHAR",
    "TERMINAL_WIDTH",
    "Direction",
    "clear_line",
    "forceWrite",
    "linebreak",
    "move_cursor",
    "reset_cursor",
    "writeColor",
]


class Direction(enum.Enum):
    """Where the highlighted choice of a menu moves."""

    UP = 0
    DOWN = 1


def forceWrite(content: str, end: str = "") -> None:
    """Write ``content`` and flush at once."""
    sys.stdout.write(str(content) + end)
    sys.stdout.flush()


def writeColor(content: str, color: int, end: str = "") -> None:
    """Write ``content`` in the ANSI colour ``color`` (32 green, 31 red, ...)."""
    forceWrite(f"\033[{color}m{content}\033[0m", end)


def reset_cursor() -> None:
    """Move the cursor to the start of the line."""
    forceWrite("\r")


def move_cursor(num_lines: int, direction: str) -> None:
    """Move the cursor ``num_lines`` in ``direction`` (``"UP"``, ``"DOWN"``, ...)."""
    forceWrite(f"\033[{num_lines}{CURSOR_TO_CHAR[direction.upper()]}")


def clear_line() -> None:
    """Blank the current line and return to its start."""
    forceWrite(" " * TERMINAL_WIDTH)
    reset_cursor()


def linebreak() -> None:
    """Write a rule as wide as the terminal."""
    reset_cursor()
    forceWrite("-" * TERMINAL_WIDTH)
