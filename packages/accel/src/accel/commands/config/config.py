"""Accelerate's ``accelerate.commands.config.config``: ``accel config`` (the questionnaire).

Example:
    >>> from accel.commands.config.config import config_command, config_command_parser
    >>> config_command(config_command_parser().parse_args(["--config_file", "c.yaml"]))  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from typing import Any

from accel.commands._parsers import command_parser, run_or_exit
from accel.commands.config.cluster import get_cluster_input
from accel.commands.config.config_args import (
    ClusterConfig,
    cache_dir,
    default_config_file,
    default_yaml_config_file,
)
from accel_launch.commands import config as _config

description = "Answer questions about your setup and save them as accel's config file."

__all__ = [
    "cache_dir",
    "config_command",
    "config_command_parser",
    "default_config_file",
    "default_yaml_config_file",
    "description",
    "get_user_input",
    "main",
]


def get_user_input() -> ClusterConfig:
    """Ask the questions (accel configures local machines only) and return the answers."""
    return get_cluster_input()


def config_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``config`` parser (without its subcommands): standalone, or added to ``subparsers``."""
    return command_parser(_config.add_config_parser, subparsers, config_command)


def config_command(args: argparse.Namespace) -> None:
    """Ask the questions and write the answers to ``args.config_file`` (or the default file)."""
    run_or_exit(_config.questionnaire_command, args)


def main() -> None:
    """``python -m accel.commands.config.config [--config_file FILE]``."""
    config_command(config_command_parser().parse_args())


if __name__ == "__main__":
    main()
