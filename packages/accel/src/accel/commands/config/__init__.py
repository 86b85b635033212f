"""Accelerate's ``accelerate.commands.config`` package: ``accel config`` and its subcommands.

Example:
    >>> from accel.commands.config import get_config_parser
    >>> args = get_config_parser().parse_args(["default", "--config_file", "c.yaml"])
    >>> args.func(args)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from typing import Any

from accel.commands.config.config import config_command_parser
from accel.commands.config.config_args import default_config_file, load_config_from_file
from accel.commands.config.default import default_command_parser
from accel.commands.config.update import update_command_parser

__all__ = ["default_config_file", "get_config_parser", "load_config_from_file", "main"]


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``config`` parser with its ``default`` and ``update`` subcommands."""
    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser = config_command_parser(subparsers)
    subcommands = parser.add_subparsers(title="subcommands", dest="subcommand")
    default_command_parser(subcommands, parents=[parent])
    update_command_parser(subcommands, parents=[parent])
    return parser


def main() -> None:
    """``python -m accel.commands.config [default|update] [--config_file FILE]``."""
    parser = get_config_parser()
    args = parser.parse_args()
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        raise SystemExit(1)
    func(args)
