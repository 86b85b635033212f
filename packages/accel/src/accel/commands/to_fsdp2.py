"""Accelerate's ``accelerate.commands.to_fsdp2`` module path, over accel-launch's ``accel to-fsdp2``.

The tables say how each FSDP1 key of ``fsdp_config`` becomes an FSDP2 key; accel-launch's
converter applies them (and explains each dropped key).

Example:
    >>> convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}})
    {'fsdp_config': {'fsdp_reshard_after_forward': False, 'fsdp_version': 2}}
"""

from __future__ import annotations

import argparse
import enum
import logging
from pathlib import Path
from typing import Any

from accel.commands._parsers import command_parser
from accel_launch.commands import to_fsdp2 as _to_fsdp2
from accel_launch.errors import ConfigError

logger = logging.getLogger(__name__)


class ConversionStatus(enum.Enum):
    """What happens to an FSDP1 key that has no FSDP2 key."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


_KEPT = (
    "fsdp_version",
    "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params",
    "fsdp_state_dict_type",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params",
    "fsdp_activation_checkpointing",
)
#: FSDP1 key -> its FSDP2 key, or the status of a key FSDP2 has no use for.
ARGUMENT_KEY_MAPPING: dict[str, str | ConversionStatus] = {
    **{key: key for key in _KEPT},
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    **{key: ConversionStatus.REMOVED for key in _to_fsdp2.DROPPED},
}
#: FSDP1 key -> how its values become the FSDP2 key's values.
ARGUMENT_VALUE_MAPPING: dict[str, dict[str, bool]] = {
    "fsdp_sharding_strategy": dict(_to_fsdp2.RESHARD_AFTER_FORWARD),
    "fsdp_reshard_after_forward": dict(_to_fsdp2.RESHARD_AFTER_FORWARD),
}

__all__ = [
    "ARGUMENT_KEY_MAPPING",
    "ARGUMENT_VALUE_MAPPING",
    "ConversionStatus",
    "convert_config_to_fsdp2",
    "load_config",
    "logger",
    "to_fsdp2_command",
    "to_fsdp2_command_parser",
]


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its ``fsdp_config`` in FSDP2 keys; what was dropped is logged.

    Raises:
        accel_launch.errors.ConfigError: ``fsdp_sharding_strategy`` holds an unknown value.
    """
    notes: list[str] = []
    converted = _to_fsdp2.convert_config_to_fsdp2(config, notes)
    for note in notes:
        logger.warning(note)
    return converted


def load_config(config_file: str) -> dict[str, Any]:
    """The YAML mapping in ``config_file``.

    Raises:
        accel_launch.errors.ConfigError: The file is missing, not YAML, or not a mapping.
    """
    import yaml

    path = Path(config_file)
    if not path.is_file():
        raise ConfigError("config file does not exist", source=str(path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"is not valid YAML: {error}", source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("does not hold a mapping of keys", source=str(path))
    return data


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``to-fsdp2`` parser: standalone, or added to ``subparsers`` with ``func`` set."""
    return command_parser(_to_fsdp2.add_parser, subparsers, to_fsdp2_command)


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert ``args.config_file`` and write it to ``args.output_file`` (or over it).

    The file is read with this module's :func:`load_config` and converted with
    :func:`convert_config_to_fsdp2`, whose notes (dropped keys, a config already on FSDP2) are
    logged as warnings on this module's ``logger``.

    Raises:
        accel_launch.errors.ConfigFileNotFoundError: ``--config_file`` does not exist (a
            ``FileNotFoundError``).
        accel_launch.errors.LaunchArgumentError: Neither ``--output_file`` nor ``--overwrite``.
        accel_launch.errors.OutputFileExistsError: ``--output_file`` exists without
            ``--overwrite`` (a ``FileExistsError``).
    """
    destination = _to_fsdp2.check_to_fsdp2_paths(args)
    converted = convert_config_to_fsdp2(load_config(args.config_file))
    _to_fsdp2.write_config(converted, destination)
    print(f"accel to-fsdp2: wrote {destination}")


def main() -> None:
    """``python -m accel.commands.to_fsdp2 --config_file IN --output_file OUT``."""
    to_fsdp2_command(to_fsdp2_command_parser().parse_args())


if __name__ == "__main__":
    main()
