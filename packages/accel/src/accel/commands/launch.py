"""Accelerate's ``accelerate.commands.launch`` module path, over accel-launch's ``accel launch``.

:func:`launch_command_parser` builds accel-launch's launch parser (every flag of ``accel launch``,
Accelerate's spellings included); :func:`launch_command` builds the launch plan from the flags
and the config file and runs it. The per-mode launchers (:func:`multi_gpu_launcher`,
:func:`deepspeed_launcher`, ...) select their mode's flag and run the same plan: in accel one
planner chooses the runner (elastic agent, XLA launcher) for every mode.

Example:
    >>> from accel.commands.launch import launch_command, launch_command_parser
    >>> args = launch_command_parser().parse_args(["--num_processes", "2", "train.py"])
    >>> launch_command(args)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import copy
import logging
from typing import Any

from accel.commands._parsers import command_parser, run_or_exit
from accel_launch.commands.launch import launch_command as _run_launch
from accel_launch.config.paths import default_config_file as _default_config_file
from accel_launch.config.schema import DEEPSPEED_MULTINODE_LAUNCHERS, DYNAMO_BACKENDS, DYNAMO_MODES
from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import DESCRIPTION, add_launch_arguments
from accel_launch.launch_helpers import prepare_sagemager_args_inputs, resolve_launch_args
from accel_launch.spellings import OneSpellingHelpFormatter

logger = logging.getLogger(__name__)

#: The default config file's path when this module was imported.
default_config_file = str(_default_config_file())
TORCH_DYNAMO_MODES = DYNAMO_MODES
#: A mode flag, and the help group holding that mode's options.
options_to_group = {
    "multi_gpu": "Distributed",
    "tpu": "TPU / XLA",
    "use_deepspeed": "DeepSpeed (with --use_deepspeed)",
    "use_fsdp": "FSDP (with --use_fsdp)",
    "use_parallelism_config": "N-D parallelism (with --use_parallelism_config)",
    "fp8_backend": "FP8 (with --mixed_precision fp8)",
}

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "TORCH_DYNAMO_MODES",
    "CustomHelpFormatter",
    "clean_option",
    "default_config_file",
    "deepspeed_launcher",
    "launch_command",
    "launch_command_parser",
    "logger",
    "main",
    "multi_gpu_launcher",
    "options_to_group",
    "sagemaker_launcher",
    "simple_launcher",
    "tpu_launcher",
    "tpu_pod_launcher",
]


def clean_option(option: str) -> str:
    """A flag's destination name: ``--num-processes`` -> ``num_processes``."""
    return option.lstrip("-").replace("-", "_")


class CustomHelpFormatter(OneSpellingHelpFormatter):
    """``accel launch``'s help: each option once, under its underscored spelling."""


def _register(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "launch",
        help="Run a script on one or many processes.",
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    add_launch_arguments(parser)
    parser.set_defaults(handler=_run_launch)
    return parser


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``launch`` parser: standalone, or added to ``subparsers`` with ``func`` set."""
    return command_parser(_register, subparsers, launch_command)


def launch_command(args: argparse.Namespace) -> None:
    """Launch ``args.training_script`` as ``accel launch`` would (config file, then the flags).

    Raises:
        SystemExit: The job failed; the exit code is the failing process's.
        accel_launch.errors.AccelLaunchError: The flags or the config are invalid.
    """
    run_or_exit(_run_launch, args)


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Fill the flags not typed from the config file (Accelerate's name for the step).

    See :func:`accel_launch.launch_helpers.resolve_launch_args`; returns ``(args, config,
    mixed_precision_from_config)``.
    """
    return resolve_launch_args(args)


def _launch_with(args: argparse.Namespace, **flags: Any) -> None:
    chosen = copy.copy(args)
    for name, value in flags.items():
        setattr(chosen, name, value)
    launch_command(chosen)


def simple_launcher(args: argparse.Namespace) -> None:
    """Run the script in one process (no process group)."""
    _launch_with(args, num_processes=1, multi_gpu=False)


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Run ``args.num_processes`` processes through PyTorch's elastic agent."""
    _launch_with(args, multi_gpu=True)


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Run the processes with DeepSpeed settings passed to the workers."""
    _launch_with(args, use_deepspeed=True)


def tpu_launcher(args: argparse.Namespace) -> None:
    """Run the script through torch_xla's launcher on this host."""
    _launch_with(args, tpu=True)


def tpu_pod_launcher(args: argparse.Namespace) -> None:
    """Launching across the hosts of a TPU pod from one machine is not supported by accel.

    Raises:
        accel_launch.errors.LaunchArgumentError: Always, saying what to do instead.
    """
    raise LaunchArgumentError(
        "tpu_pod_launcher: accel does not start a TPU pod's hosts from one machine "
        "(Accelerate's --tpu_use_cluster); set the VMs up with `accel tpu-config`, then run "
        "`accel launch --tpu` on every host."
    )


def sagemaker_launcher(sagemaker_config: Any, args: argparse.Namespace) -> None:
    """Amazon SageMaker launches are not supported by accel.

    Raises:
        accel_launch.errors.LaunchArgumentError: Always, saying what to do instead.
    """
    prepare_sagemager_args_inputs(sagemaker_config, args)


def main() -> None:
    """``python -m accel.commands.launch [flags] script.py [script args]``."""
    launch_command(launch_command_parser().parse_args())


if __name__ == "__main__":
    main()
