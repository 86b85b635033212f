"""Accelerate's ``accelerate.commands.config.default``: ``accel config default``.

Example:
    >>> from accel.commands.config.default import write_basic_config
    >>> write_basic_config(mixed_precision="no", save_location="/tmp/cfg.yaml")  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from accel.commands._parsers import run_or_exit
from accel.commands.config.config_args import default_json_config_file
from accel.commands.config.config_utils import SubcommandHelpFormatter
from accel_launch.commands import config as _config
from accel_launch.config.defaults import write_basic_config

description = "Write a basic config: every GPU of this machine, or one CPU process."

__all__ = [
    "default_command_parser",
    "default_config_command",
    "default_json_config_file",
    "description",
    "write_basic_config",
]


def default_command_parser(
    parser: Any, parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Add ``default`` to ``parser`` (the ``config`` command's subparsers action)."""
    default = _config.add_default_parser(
        parser, parents=list(parents), formatter_class=SubcommandHelpFormatter
    )
    default.set_defaults(func=default_config_command)
    return default


def default_config_command(args: argparse.Namespace) -> None:
    """Write the basic config to ``args.config_file`` unless a file is already there."""
    run_or_exit(_config.default_command, args)
