""":class:`BulletMenu`: pick one of several choices on the terminal.

On a terminal the choices are listed with the highlighted one marked; the arrow keys (or a
digit) move, Enter selects, Ctrl-C interrupts. When stdin or stdout is not a terminal (a pipe, a
CI log, a notebook), the choices are numbered and the user types a number.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from accel.commands.menu import cursor
from accel.commands.menu.helpers import (
    Direction,
    clear_line,
    forceWrite,
    move_cursor,
    reset_cursor,
    writeColor,
)
from accel.commands.menu.input import KeyHandler, mark, mark_multiple
from accel.commands.menu.keymap import KEYMAP

#: Whether this runs in Google Colab (whose output cell is no terminal).
in_colab = "google.colab" in sys.modules
MAX_TRIES = 5

__all__ = ["KEYMAP", "BulletMenu", "in_colab"]


class BulletMenu(metaclass=KeyHandler):
    """A menu of ``choices`` under ``prompt``; :meth:`run` returns the chosen index."""

    def __init__(self, prompt: str | None = None, choices: Sequence[Any] = ()) -> None:
        self.prompt = prompt
        self.choices = list(choices)
        self.position = 0
        self.current_selection: str | None = None
        self.arrow_char = " ➔ "

    def write_choice(self, index: int, end: str = "") -> None:
        """Write the text of choice ``index``."""
        forceWrite(str(self.choices[index]), end)

    def print_choice(self, index: int) -> None:
        """Write the row of choice ``index``, highlighted when it is the current one."""
        if index == self.position:
            forceWrite(self.arrow_char)
            writeColor(str(self.choices[index]), 32)
        else:
            forceWrite(" " * len(self.arrow_char))
            self.write_choice(index)
        reset_cursor()

    def move_direction(self, direction: Direction, num_spaces: int = 1) -> None:
        """Move the highlight ``num_spaces`` rows up or down (not past the first or last)."""
        step = num_spaces if direction is Direction.DOWN else -num_spaces
        old, new = self.position, self.position + step
        if num_spaces <= 0 or not 0 <= new < len(self.choices):
            return
        self.position = new
        clear_line()
        self.print_choice(old)
        move_cursor(num_spaces, direction.name)
        clear_line()
        self.print_choice(new)

    @mark(KEYMAP["up"])
    def move_up(self) -> None:
        """Highlight the choice above."""
        self.move_direction(Direction.UP)

    @mark(KEYMAP["down"])
    def move_down(self) -> None:
        """Highlight the choice below."""
        self.move_direction(Direction.DOWN)

    @mark(KEYMAP["newline"])
    def select(self) -> int:
        """Choose the highlighted row."""
        move_cursor(len(self.choices) - self.position, "DOWN")
        return self.position

    @mark(KEYMAP["interrupt"])
    def interrupt(self) -> None:
        """Ctrl-C: leave the menu.

        Raises:
            KeyboardInterrupt: Always.
        """
        move_cursor(len(self.choices) - self.position, "DOWN")
        raise KeyboardInterrupt

    @mark_multiple(*[KEYMAP[str(number)] for number in range(10)])
    def select_row(self) -> None:
        """A digit key: highlight that row (when there is one)."""
        index = int(self.current_selection or "0")
        step = index - self.position
        if 0 <= index < len(self.choices) and step:
            self.move_direction(Direction.DOWN if step > 0 else Direction.UP, abs(step))

    def run(self, default_choice: int = 0) -> int:
        """Show the menu and return the index chosen (``default_choice`` is highlighted first).

        Raises:
            ValueError: There are no choices, ``default_choice`` is not one of them, or (without
                a terminal) no valid number was typed in five tries.
        """
        if not 0 <= default_choice < len(self.choices):
            raise ValueError(
                f"BulletMenu.run(default_choice={default_choice}): pick an index between 0 and "
                f"{len(self.choices) - 1} (the menu has {len(self.choices)} choices)."
            )
        if in_colab or not (sys.stdin.isatty() and sys.stdout.isatty()):
            return self._run_numbered(default_choice)
        return self._run_keys(default_choice)

    def _run_numbered(self, default_choice: int) -> int:
        if self.prompt:
            print(self.prompt)
        for index, choice in enumerate(self.choices):
            print(f"  {index}. {choice}")
        for _ in range(MAX_TRIES):
            try:
                answer = input(f"Type a number [{default_choice}]: ").strip()
            except EOFError:
                return default_choice
            if not answer:
                return default_choice
            if answer.isdigit() and int(answer) < len(self.choices):
                return int(answer)
            print(f"{answer!r} is not a choice: type a number from 0 to {len(self.choices) - 1}.")
        raise ValueError(f"no valid choice for {self.prompt or 'the menu'!r} in {MAX_TRIES} tries")

    def _run_keys(self, default_choice: int) -> int:
        if self.prompt:
            forceWrite(self.prompt, "\n")
            forceWrite("Move with the arrow or number keys; select with Enter.", "\n")
        self.position = default_choice
        for index in range(len(self.choices)):
            self.print_choice(index)
            forceWrite("\n")
        move_cursor(len(self.choices) - self.position, "UP")
        with cursor.hide():
            while True:
                choice = self.handle_input()  # type: ignore[attr-defined]
                if isinstance(choice, int):
                    reset_cursor()
                    for _ in range(len(self.choices) + 1):
                        move_cursor(1, "UP")
                        clear_line()
                    self.write_choice(choice, "\n")
                    return choice
