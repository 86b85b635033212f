"""Accelerate's ``accelerate.commands.config.update``: ``accel config update``.

Example:
    >>> from accel.commands.config.update import update_config
    >>> update_config(argparse.Namespace(config_file="old.yaml"))  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from accel.commands.config.config_args import default_config_file
from accel.commands.config.config_utils import SubcommandHelpFormatter
from accel_launch.commands import config as _config

description = (
    "Read a config file (yours or Accelerate's), drop what accel ignores, write it back in the "
    "current format."
)

__all__ = [
    "default_config_file",
    "description",
    "update_command_parser",
    "update_config",
    "update_config_command",
]


def update_config(args: argparse.Namespace) -> str:
    """Rewrite ``args.config_file`` (or the default file) in the current format; return its path.

    Raises:
        accel_launch.errors.ConfigError: There is no config file, or it holds an invalid value.
    """
    return str(_config.update_config_file(args.config_file))


def update_command_parser(
    parser: Any, parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Add ``update`` to ``parser`` (the ``config`` command's subparsers action)."""
    update = _config.add_update_parser(
        parser, parents=list(parents), formatter_class=SubcommandHelpFormatter
    )
    update.set_defaults(func=update_config_command)
    return update


def update_config_command(args: argparse.Namespace) -> None:
    """Update the file and say where it was written."""
    print(f"accel configuration updated at {update_config(args)}")
