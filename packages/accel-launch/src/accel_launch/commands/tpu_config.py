"""``accel tpu-config``: run setup commands on every VM of a Cloud TPU through ``gcloud``.

It builds ``gcloud [alpha] compute tpus tpu-vm ssh NAME --zone ZONE --command "cd /usr/share;
[pip install accel]; COMMANDS" --worker all`` (Accelerate's command line, installing accel instead
of Accelerate), prints it with ``--debug`` instead of running it, and otherwise runs it, which needs
the Google Cloud CLI (``gcloud``) on PATH. Unset flags come from the config file's ``tpu_name``,
``tpu_zone``, ``commands`` and ``command_file`` keys.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from accel_launch.errors import (
    AccelLaunchError,
    ConfigError,
    ConfigFileNotFoundError,
    LaunchArgumentError,
)
from accel_launch.spellings import add_hyphenated_spellings


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``tpu-config``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "tpu-config",
        help="Run setup commands on every VM of a Cloud TPU (through gcloud).",
        description="Run commands on every TPU VM (gcloud compute tpus tpu-vm ssh --worker all) "
        "before `accel launch`.",
    )
    config = parser.add_argument_group("Config")
    config.add_argument("--config_file", default=None, help="Config file to take defaults from.")
    config.add_argument("--tpu_name", default=None, help="The TPU (default: the config's).")
    config.add_argument("--tpu_zone", default=None, help="Its zone (default: the config's).")
    pod = parser.add_argument_group("On the TPU VMs")
    pod.add_argument("--use_alpha", action="store_true", help="Use `gcloud alpha`.")
    pod.add_argument("--command_file", default=None, help="File of commands, one per line.")
    pod.add_argument(
        "--command", action="append", default=None, help="A command to run; repeat for several."
    )
    pod.add_argument(
        "--install_accelerate", action="store_true", help="pip install accel on the VMs first."
    )
    pod.add_argument(
        "--accelerate_version",
        default="latest",
        help="accel version to install: 'latest' or a version such as 0.3.0.",
    )
    pod.add_argument(
        "--debug", action="store_true", help="Print the gcloud command instead of running it."
    )
    parser.set_defaults(handler=tpu_config_command)
    return add_hyphenated_spellings(parser)


def _file_defaults(path: str | None) -> dict[str, Any]:
    """The config file's keys as written (``tpu_name``... are keys ``accel launch`` ignores)."""
    import yaml

    from accel_launch.config.paths import locate_config_file

    location = locate_config_file(path)
    if location.path is None:
        return {}
    if not location.path.is_file():
        raise ConfigFileNotFoundError(
            "config file does not exist",
            key="--config_file",
            value=path,
            fix="Fix the path, or drop --config_file to use the default config",
        )
    try:
        data = yaml.safe_load(location.path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"is not valid YAML: {error}", source=str(location.path)) from None
    return data if isinstance(data, dict) else {}


def _install_command(version: str) -> str:
    if version == "latest":
        return "pip install -U accel"
    if version == "dev":
        raise LaunchArgumentError(
            "--accelerate_version dev: accel has no development index to install from; pass "
            "'latest' or a version such as 0.3.0."
        )
    return f"pip install accel=={version}"


def build_tpu_command(args: argparse.Namespace) -> list[str]:
    """The ``gcloud`` command line ``args`` describe (config-file values filled in).

    Raises:
        LaunchArgumentError: No TPU name or zone, or no command to run.
    """
    defaults = _file_defaults(args.config_file)
    name = args.tpu_name or defaults.get("tpu_name")
    zone = args.tpu_zone or defaults.get("tpu_zone")
    lines: list[str] = list(args.command or [])
    command_file = args.command_file or (None if lines else defaults.get("command_file"))
    if not lines and not command_file:
        lines = list(defaults.get("commands") or [])
    if command_file:
        try:
            lines = Path(command_file).read_text().splitlines()
        except OSError as error:
            raise LaunchArgumentError(
                f"--command_file {command_file!r} cannot be read ({error.strerror or error})."
            ) from None
    if not lines:
        raise LaunchArgumentError(
            "no command to run on the TPU VMs: pass --command (repeatable) or --command_file."
        )
    if not name or not zone:
        raise LaunchArgumentError(
            "the TPU needs --tpu_name and --tpu_zone (or tpu_name / tpu_zone in the config file)."
        )
    remote = ["cd /usr/share"]
    if args.install_accelerate:
        remote.append(_install_command(args.accelerate_version))
    remote += lines
    cmd = ["gcloud", *(["alpha"] if args.use_alpha else [])]
    cmd += ["compute", "tpus", "tpu-vm", "ssh", str(name), "--zone", str(zone)]
    return [*cmd, "--command", "; ".join(remote), "--worker", "all"]


def tpu_config_command(args: argparse.Namespace) -> int:
    """Run ``accel tpu-config``.

    Raises:
        AccelLaunchError: ``gcloud`` is not on PATH (without ``--debug``).
    """
    cmd = build_tpu_command(args)
    if args.debug:
        print(f"Running {shlex.join(cmd)}")
        return 0
    if shutil.which("gcloud") is None:
        raise AccelLaunchError(
            "tpu-config runs its commands through the Google Cloud CLI, but `gcloud` is not on "
            "PATH; install it (https://cloud.google.com/sdk/docs/install) or pass --debug to "
            "print the command."
        )
    completed = subprocess.run(cmd, check=False)
    if completed.returncode == 0:
        print("Successfully set up the TPU VMs.")
    return completed.returncode
