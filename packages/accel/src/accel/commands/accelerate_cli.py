"""Accelerate's ``accelerate.commands.accelerate_cli``: the ``accel`` command built from its parts.

:func:`main` registers each subcommand through this package's ``*_command_parser`` functions
(``config``, ``env``, ``estimate-memory``, ``launch``, ``merge-weights``, ``tpu-config``, ``test``,
``to-fsdp2``) and runs the one named; accel-launch's errors become one line and an exit code,
as in ``accel``. ``python -m accel.commands.accelerate_cli env`` runs ``accel env``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accel.commands.config import get_config_parser
from accel.commands.env import env_command_parser
from accel.commands.estimate import estimate_command_parser
from accel.commands.launch import launch_command_parser
from accel.commands.merge import merge_command_parser
from accel.commands.test import test_command_parser
from accel.commands.to_fsdp2 import to_fsdp2_command_parser
from accel.commands.tpu import tpu_command_parser
from accel.commands.utils import CustomArgumentParser
from accel_launch.cli import run_command

__all__ = ["main"]


def _build_parser() -> CustomArgumentParser:
    parser = CustomArgumentParser(
        prog="accel", usage="accel <command> [<args>]", allow_abbrev=False
    )
    subparsers = parser.add_subparsers(help="accel command helpers", dest="accel_command")
    get_config_parser(subparsers=subparsers)
    estimate_command_parser(subparsers)
    env_command_parser(subparsers=subparsers)
    launch_command_parser(subparsers=subparsers)
    merge_command_parser(subparsers=subparsers)
    tpu_command_parser(subparsers=subparsers)
    test_command_parser(subparsers=subparsers)
    to_fsdp2_command_parser(subparsers=subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand.

    Raises:
        SystemExit: With no subcommand (after the help, code 1), or when the command fails
            (its exit code).
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None) or getattr(args, "handler", None)
    if func is None:
        parser.print_help()
        raise SystemExit(1)

    def handler(namespace: argparse.Namespace) -> int:
        result = func(namespace)
        return result if isinstance(result, int) else 0

    try:
        code = run_command(f"accel {args.accel_command}", handler, args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
