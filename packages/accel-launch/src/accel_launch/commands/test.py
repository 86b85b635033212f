"""``accel test``: launch :mod:`accel_launch.sanity_check` with the config in effect, report the verdict."""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

from accel_launch.launch_args import build_launch_parser


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``test``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "test",
        help="Check the distributed setup by launching a short sanity script.",
        description="Launch a sanity check (ranks, barrier, all_reduce, main_process_first) "
        "with the config in effect.",
    )
    parser.add_argument(
        "--config_file", default=None, help="Config file to test (default: the default one)."
    )
    parser.set_defaults(handler=test_command)
    return parser


def test_command(args: argparse.Namespace) -> int:
    """Launch the sanity script through ``accel launch``; 0 when every process passed."""
    from accel_launch.commands.launch import launch_command

    with tempfile.TemporaryDirectory(prefix="accel_test_") as workdir:
        argv = ["--config_file", args.config_file] if args.config_file else []
        argv += ["-m", "accel_launch.sanity_check", "--workdir", workdir]
        code = launch_command(build_launch_parser("accel test").parse_args(argv))
    if code == 0:
        print("Test is a success! You are ready for your distributed training!")
    else:
        print(
            f"accel test: the sanity check FAILED (exit code {code}); see the output above.",
            file=sys.stderr,
        )
    return code
