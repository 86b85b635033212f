"""Accelerate's ``accelerate.commands.test`` module path, over accel-launch's ``accel test``.

``test_command`` launches accel-launch's sanity script with the config in effect.

Example:
    >>> from accel.commands.test import test_command, test_command_parser
    >>> test_command(test_command_parser().parse_args([]))  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from typing import Any

from accel.commands._parsers import command_parser, run_or_exit
from accel_launch.commands import test as _test

__all__ = ["main", "test_command", "test_command_parser"]


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``test`` parser: standalone, or added to ``subparsers`` with ``func`` set."""
    return command_parser(_test.add_parser, subparsers, test_command)


def test_command(args: argparse.Namespace) -> None:
    """Launch the sanity check; say so when every process passed.

    Raises:
        SystemExit: A process failed the check (its exit code).
    """
    run_or_exit(_test.test_command, args)


def main() -> None:
    """``python -m accel.commands.test [--config_file FILE]``."""
    test_command(test_command_parser().parse_args())


if __name__ == "__main__":
    main()
