"""Accelerate's ``accelerate.commands.env`` module path, over accel-launch's ``accel env``.

Example:
    >>> from accel.commands.env import env_command, env_command_parser
    >>> info = env_command(env_command_parser().parse_args([]))  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import platform
from shutil import which
from typing import Any

from accel.__about__ import __version__ as version
from accel.commands._parsers import command_parser
from accel_launch.commands import env as _env
from accel_launch.config.paths import default_config_file as _default_config_file

#: The default config file's path when this module was imported.
default_config_file = str(_default_config_file())

__all__ = ["default_config_file", "env_command", "env_command_parser", "main", "version"]


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``env`` parser: standalone, or added to ``subparsers`` with ``func`` set."""
    return command_parser(_env.add_parser, subparsers, env_command)


def _accelerate_keys() -> dict[str, str]:
    """The report's facts under the keys of Accelerate's ``env_command`` dict."""
    import importlib.metadata

    import torch

    try:
        numpy_version = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        numpy_version = "not installed"

    if torch.cuda.is_available():
        accelerator = "CUDA"
    elif getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        accelerator = "XPU"
    elif torch.backends.mps.is_available():
        accelerator = "MPS"
    else:
        accelerator = "N/A"
    return {
        "`Accelerate` version": version,
        "Platform": platform.platform(),
        # The command-line tool that plays `accelerate`'s part: accel's `accel`.
        "`accelerate` bash location": which("accel") or "Not found",
        "Python version": platform.python_version(),
        "Numpy version": numpy_version,
        "PyTorch version": torch.__version__,
        "PyTorch accelerator": accelerator,
    }


def env_command(args: argparse.Namespace) -> dict[str, str]:
    """Print the report (versions, platform, hardware, config) and return its facts as a dict.

    The dict holds the report's lines (``key: value``) and Accelerate's keys for the same facts
    (``"`Accelerate` version"``, ``"`accelerate` bash location"`` (where ``accel`` is),
    ``"PyTorch accelerator"``...).
    """
    report = _env.env_report(args.config_file)
    print(report)
    info: dict[str, str] = {}
    for line in report.splitlines():
        if line.startswith("- ") and ": " in line:
            key, value = line[2:].split(": ", 1)
            info[key] = value
    info.update(_accelerate_keys())
    return info


def main() -> int:
    """``python -m accel.commands.env``."""
    env_command(env_command_parser().parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
