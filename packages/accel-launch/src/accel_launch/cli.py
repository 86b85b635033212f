"""Console entry points: ``accel {launch,config,test,env,...}`` and ``accel-launch`` (= ``accel launch``).

Only argparse and torch-free modules are imported here; each command imports what it needs when it
runs, so ``accel --help`` and ``accel config default`` start in a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from accel_launch.__about__ import __version__
from accel_launch.errors import AccelLaunchError, ConfigError, JobFailedError, LaunchArgumentError
from accel_launch.launch_args import DESCRIPTION, add_launch_arguments, build_launch_parser
from accel_launch.plugin_commands import add_plugin_commands

Handler = Callable[[argparse.Namespace], int]


def _launch(args: argparse.Namespace) -> int:
    from accel_launch.commands.launch import launch_command

    return launch_command(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``accel`` parser: six built-in subcommands and those installed packages provide."""
    from accel_launch.commands import config as config_cmd
    from accel_launch.commands import env as env_cmd
    from accel_launch.commands import test as test_cmd
    from accel_launch.commands import to_fsdp2 as to_fsdp2_cmd
    from accel_launch.commands import tpu_config as tpu_config_cmd

    parser = argparse.ArgumentParser(
        prog="accel",
        description="Launch, configure and check distributed PyTorch jobs.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"accel-launch {__version__}")
    commands = parser.add_subparsers(dest="command")
    launch = commands.add_parser(
        "launch",
        help="Run a script on one or many processes.",
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    add_launch_arguments(launch)
    launch.set_defaults(handler=_launch)
    config_cmd.add_parser(commands)
    test_cmd.add_parser(commands)
    env_cmd.add_parser(commands)
    to_fsdp2_cmd.add_parser(commands)
    tpu_config_cmd.add_parser(commands)
    builtin = ["launch", "config", "test", "env", "to-fsdp2", "tpu-config"]
    extra = add_plugin_commands(commands, reserved=set(builtin))
    commands.metavar = "{" + ",".join(builtin + extra) + "}"
    return parser


def run_command(name: str, handler: Handler, args: argparse.Namespace) -> int:
    """Run ``handler``, turning accel-launch errors into a one-line message and an exit code."""
    try:
        return handler(args)
    except JobFailedError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return error.exit_code
    except (ConfigError, LaunchArgumentError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except AccelLaunchError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """``accel``: dispatch to a subcommand; with none, print the help and return 1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 1
    return run_command(f"accel {args.command}", handler, args)


def launch_main(argv: Sequence[str] | None = None) -> int:
    """``accel-launch``: the same as ``accel launch``."""
    args = build_launch_parser("accel-launch").parse_args(argv)
    return run_command("accel-launch", _launch, args)


if __name__ == "__main__":
    sys.exit(main())
