"""Accelerate's ``accelerate.commands.utils``: an argument parser that takes both spellings.

:class:`CustomArgumentParser` accepts ``--num-processes`` wherever ``--num_processes`` is
defined (accel-launch's :func:`~accel_launch.spellings.add_hyphenated_spellings`), and lists
each option once in its help. Subcommand parsers made from it are of the same class.

Example:
    >>> parser = CustomArgumentParser(prog="tool")
    >>> _ = parser.add_argument("--num_processes", type=int)
    >>> parser.parse_args(["--num-processes", "2"]).num_processes
    2
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from accel_launch.spellings import add_hyphenated_spellings


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group of a :class:`CustomArgumentParser` (its options get both spellings)."""


class CustomArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` where every ``--multi_word`` option also parses as ``--multi-word``."""

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        """A group whose options take both spellings once the parser parses."""
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Add the hyphenated twins of the options defined so far, then parse."""
        add_hyphenated_spellings(self)
        return super().parse_known_args(args, namespace)
