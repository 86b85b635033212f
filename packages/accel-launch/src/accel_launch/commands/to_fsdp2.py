"""``accel to-fsdp2``: rewrite a config file's FSDP1 ``fsdp_config`` with FSDP2's keys.

Keys FSDP2 keeps are carried over; ``fsdp_sharding_strategy`` becomes
``fsdp_reshard_after_forward`` (``FULL_SHARD``/``HYBRID_SHARD``: true, the others: false); keys
FSDP2 has no use for (``fsdp_backward_prefetch``, ``fsdp_forward_prefetch``,
``fsdp_sync_module_states``, ``fsdp_use_orig_params``) are dropped with a note; ``fsdp_version``
becomes 2. Other sections and keys are left as they are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from accel_launch.errors import (
    ConfigError,
    ConfigFileNotFoundError,
    LaunchArgumentError,
    OutputFileExistsError,
)
from accel_launch.spellings import add_hyphenated_spellings

#: FSDP1 sharding strategy -> FSDP2's ``reshard_after_forward``.
RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}
#: FSDP1 keys with no FSDP2 counterpart, and why.
DROPPED = {
    "fsdp_backward_prefetch": "FSDP2 always prefetches the next all-gather in backward",
    "fsdp_backward_prefetch_policy": "FSDP2 always prefetches the next all-gather in backward",
    "fsdp_forward_prefetch": "FSDP2 has no forward-prefetch setting",
    "fsdp_sync_module_states": "FSDP2 loads full state dicts by broadcast instead",
    "fsdp_use_orig_params": "FSDP2 always keeps the original parameters",
}


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register ``to-fsdp2``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "to-fsdp2",
        help="Convert a config file's FSDP1 settings to FSDP2.",
        description="Convert the fsdp_config of a config file from FSDP1 keys to FSDP2 keys.",
    )
    parser.add_argument("--config_file", required=True, help="The config file to convert.")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write over --output_file (or, without it, over --config_file) if it exists.",
    )
    parser.add_argument("--output_file", default=None, help="Where to write the converted config.")
    parser.set_defaults(handler=to_fsdp2_command)
    return add_hyphenated_spellings(parser)


def convert_config_to_fsdp2(
    config: dict[str, Any], notes: list[str] | None = None
) -> dict[str, Any]:
    """Return ``config`` with its ``fsdp_config`` in FSDP2 keys (unchanged when already FSDP2).

    Raises:
        ConfigError: ``fsdp_sharding_strategy`` holds an unknown value.
    """
    said = notes if notes is not None else []
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        said.append("no fsdp_config in the file: nothing to convert")
        return config
    if int(fsdp.get("fsdp_version", 1)) == 2:
        said.append("Config already specifies FSDP2, skipping conversion...")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        if key in DROPPED:
            said.append(f"dropped {key} ({DROPPED[key]})")
        elif key == "fsdp_sharding_strategy" or (
            key == "fsdp_reshard_after_forward" and isinstance(value, str)
        ):
            name = str(value).strip().upper()
            if name.isdigit():
                name = list(RESHARD_AFTER_FORWARD)[int(name) - 1]
            if name not in RESHARD_AFTER_FORWARD:
                raise ConfigError(
                    f"fsdp_config.{key}={value!r} is not one of "
                    f"{', '.join(RESHARD_AFTER_FORWARD)}; fix it, then convert."
                )
            converted["fsdp_reshard_after_forward"] = RESHARD_AFTER_FORWARD[name]
        else:
            converted[key] = value
    converted["fsdp_version"] = 2
    return {**config, "fsdp_config": converted}


def check_to_fsdp2_paths(args: argparse.Namespace) -> Path:
    """The file ``accel to-fsdp2`` writes: ``--output_file``, or the input with ``--overwrite``.

    Raises:
        ConfigFileNotFoundError: ``--config_file`` does not exist.
        LaunchArgumentError: Neither ``--output_file`` nor ``--overwrite`` was given.
        OutputFileExistsError: ``--output_file`` exists and ``--overwrite`` was not given.
    """
    source = Path(args.config_file)
    if not source.is_file():
        raise ConfigFileNotFoundError(
            "config file does not exist",
            key="--config_file",
            value=args.config_file,
            fix="Pass the path of the FSDP1 config to convert",
        )
    target = Path(args.output_file) if args.output_file else None
    if target is None and not args.overwrite:
        raise LaunchArgumentError(
            "give --output_file for the converted config, or --overwrite to replace "
            f"{args.config_file!r}."
        )
    if target is not None and target.exists() and not args.overwrite:
        raise OutputFileExistsError(
            f"--output_file {args.output_file!r} exists; pass --overwrite to replace it."
        )
    return target or source


def write_config(config: dict[str, Any], destination: Path) -> None:
    """Write ``config`` as YAML, keys in their order."""
    import yaml

    destination.write_text(yaml.safe_dump(config, sort_keys=False))


def to_fsdp2_command(args: argparse.Namespace) -> int:
    """Run ``accel to-fsdp2``."""
    import yaml

    destination = check_to_fsdp2_paths(args)
    source = Path(args.config_file)
    try:
        config = yaml.safe_load(source.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"is not valid YAML: {error}", source=str(source)) from None
    if not isinstance(config, dict):
        raise ConfigError("does not hold a mapping of keys", source=str(source))
    notes: list[str] = []
    converted = convert_config_to_fsdp2(config, notes)
    write_config(converted, destination)
    for note in notes:
        print(f"accel to-fsdp2: {note}", file=sys.stderr)
    print(f"accel to-fsdp2: wrote {destination}")
    return 0
