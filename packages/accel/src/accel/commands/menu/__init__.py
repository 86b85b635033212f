"""Accelerate's ``accelerate.commands.menu``: a keyboard menu for the terminal.

:class:`BulletMenu` lets the user pick one choice with the arrow keys (or a digit) and Enter when
stdin is a terminal, and asks for the choice's number otherwise.

Example:
    >>> from accel.commands.menu import BulletMenu
    >>> BulletMenu("Which backend?", ["gloo", "nccl"]).run(default_choice=0)  # doctest: +SKIP
"""

from __future__ import annotations

from accel.commands.menu.selection_menu import BulletMenu

__all__ = ["BulletMenu"]
