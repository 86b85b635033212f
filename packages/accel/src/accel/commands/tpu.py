"""Accelerate's ``accelerate.commands.tpu`` module path, over accel-launch's ``accel tpu-config``.

Example:
    >>> from accel.commands.tpu import tpu_command_launcher, tpu_command_parser
    >>> args = tpu_command_parser().parse_args(
    ...     ["--tpu_name", "pod", "--tpu_zone", "us-central1-a", "--command", "ls", "--debug"]
    ... )
    >>> tpu_command_launcher(args)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from typing import Any

from accel.commands._parsers import command_parser, run_or_exit
from accel_launch.commands import tpu_config as _tpu
from accel_launch.config.paths import default_config_file as _default_config_file

#: The default config file's path when this module was imported.
default_config_file = str(_default_config_file())

__all__ = ["default_config_file", "main", "tpu_command_launcher", "tpu_command_parser"]


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``tpu-config`` parser: standalone, or added to ``subparsers`` with ``func`` set."""
    return command_parser(_tpu.add_parser, subparsers, tpu_command_launcher)


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Run (or with ``--debug`` print) the ``gcloud ... tpu-vm ssh`` command for every TPU VM.

    Raises:
        SystemExit: ``gcloud`` failed (its exit code).
        accel_launch.errors.AccelLaunchError: ``gcloud`` is not on PATH, or no TPU is named.
    """
    run_or_exit(_tpu.tpu_config_command, args)


def main() -> None:
    """``python -m accel.commands.tpu --tpu_name NAME --tpu_zone ZONE --command CMD``."""
    tpu_command_launcher(tpu_command_parser().parse_args())


if __name__ == "__main__":
    main()
