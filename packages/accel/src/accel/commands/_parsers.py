"""How the ``accel.commands`` modules build Accelerate's ``*_command_parser(subparsers=None)``.

accel-launch registers each subcommand with ``add_parser(commands)``, where ``commands`` is an
argparse subparsers action. Accelerate's functions also build a standalone parser when given no
subparsers; :class:`StandaloneCommands` stands in for the action then, so both paths share one
definition of the arguments.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Handler = Callable[[argparse.Namespace], int]


class StandaloneCommands:
    """A stand-in for a subparsers action whose ``add_parser`` returns a top-level parser."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A parser named ``accel NAME`` (argparse's ``help=`` of a subcommand is dropped)."""
        kwargs.pop("help", None)
        kwargs.pop("aliases", None)
        kwargs.setdefault("allow_abbrev", False)
        return argparse.ArgumentParser(prog=f"accel {name}", **kwargs)


def command_parser(
    register: Callable[[Any], argparse.ArgumentParser],
    subparsers: Any,
    func: Callable[[argparse.Namespace], Any],
) -> argparse.ArgumentParser:
    """Register a subcommand on ``subparsers`` (with ``func`` as its default), or build it alone.

    Args:
        register: accel-launch's ``add_parser(commands)`` for the subcommand.
        subparsers: An argparse subparsers action, or ``None`` for a standalone parser.
        func: Set as the ``func`` default when added to ``subparsers`` (Accelerate's dispatch key).
    """
    if subparsers is None:
        return register(StandaloneCommands())
    parser = register(subparsers)
    parser.set_defaults(func=func)
    return parser


def run_or_exit(handler: Handler, args: argparse.Namespace) -> None:
    """Run an accel-launch handler; a non-zero exit code ends the process with that code.

    Raises:
        SystemExit: The command (or the job it launched) failed.
    """
    code = handler(args)
    if code != 0:
        raise SystemExit(code)
