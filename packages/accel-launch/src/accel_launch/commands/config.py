"""``accel config`` and its ``default`` and ``update`` subcommands.

``accel config`` asks questions; ``accel config default`` writes a basic file without asking;
``accel config update`` rewrites an existing file in the current format.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from accel_launch.config.defaults import write_basic_config
from accel_launch.config.files import read_config_file, write_config_file
from accel_launch.config.paths import default_config_file, locate_config_file
from accel_launch.errors import ConfigError
from accel_launch.spellings import add_hyphenated_spellings


def _config_file_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--config_file",
        default=None,
        help=f"{what} (default: {default_config_file()}).",
    )


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``config`` and its ``default`` / ``update`` subcommands."""
    parser = add_config_parser(commands)
    sub = parser.add_subparsers(dest="config_command", metavar="{default,update}")
    add_default_parser(sub)
    add_update_parser(sub)
    return parser


def add_config_parser(commands: Any, **kwargs: Any) -> argparse.ArgumentParser:
    """Register ``config`` alone (the questionnaire); ``kwargs`` go to ``add_parser``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "config",
        help="Create a config file by answering questions (or `default` for none).",
        description="Answer questions about your setup and save them as accel's config file.",
        **kwargs,
    )
    _config_file_arg(parser, "Where to save the config file")
    parser.set_defaults(handler=questionnaire_command)
    return add_hyphenated_spellings(parser)


def add_default_parser(commands: Any, **kwargs: Any) -> argparse.ArgumentParser:
    """Register ``default`` under ``config``'s subcommands; ``kwargs`` go to ``add_parser``."""
    default: argparse.ArgumentParser = commands.add_parser(
        "default",
        help="Write a basic config for this machine without asking anything.",
        description="Write a basic config: every GPU of this machine, or one CPU process.",
        **kwargs,
    )
    _config_file_arg(default, "Where to save the config file")
    default.add_argument(
        "--mixed_precision",
        default="no",
        choices=["no", "fp16", "bf16", "fp8"],
        help="Mixed precision mode to write (default: no).",
    )
    default.set_defaults(handler=default_command)
    return add_hyphenated_spellings(default)


def add_update_parser(commands: Any, **kwargs: Any) -> argparse.ArgumentParser:
    """Register ``update`` under ``config``'s subcommands; ``kwargs`` go to ``add_parser``."""
    update: argparse.ArgumentParser = commands.add_parser(
        "update",
        help="Rewrite an existing config file in the current format.",
        description="Read a config file (yours or Accelerate's), drop what accel ignores, write it back.",
        **kwargs,
    )
    _config_file_arg(update, "The config file to update")
    update.set_defaults(handler=update_command)
    return add_hyphenated_spellings(update)


def questionnaire_command(args: argparse.Namespace) -> int:
    """Ask the questions, write the file, say where."""
    from accel_launch.config.questionnaire import run_questionnaire

    config = run_questionnaire()
    path = write_config_file(config, args.config_file or default_config_file())
    print(f"accel configuration saved at {path}")
    return 0


def default_command(args: argparse.Namespace) -> int:
    """Write the basic config unless a file is already there (never overwritten)."""
    target = args.config_file or default_config_file()
    path = write_basic_config(args.mixed_precision, target)
    if path is None:
        print(
            f"accel config default: a configuration already exists at {target}; not overwriting it. "
            "Run `accel config` to change it, or pass another --config_file.",
            file=sys.stderr,
        )
        return 0
    print(f"accel configuration saved at {path}")
    return 0


def update_config_file(config_file: str | None) -> Path:
    """Load ``config_file`` (or the default one), warn about dropped keys, write it back.

    Returns:
        The path written: ``config_file`` itself, or the default location.

    Raises:
        ConfigError: There is no config file to update.
    """
    location = locate_config_file(config_file)
    if location.path is None:
        raise ConfigError(
            "no config file to update",
            source=str(default_config_file()),
            fix="Write one with `accel config`",
        )
    warnings: list[str] = []
    config = read_config_file(location.path, warnings)
    for line in warnings:
        print(f"accel config update: warning: {line} (dropped)", file=sys.stderr)
    target = location.path if location.explicit else default_config_file()
    return write_config_file(config, target)


def update_command(args: argparse.Namespace) -> int:
    """Update the file named by ``args.config_file`` in place and say where."""
    target = update_config_file(args.config_file)
    print(f"accel configuration updated at {target}")
    return 0
