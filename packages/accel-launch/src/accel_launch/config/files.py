"""Reading and writing config files (YAML, or JSON when the name ends in ``.json``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_launch.config.paths import ConfigLocation, locate_config_file
from accel_launch.config.schema import AccelConfig, file_key
from accel_launch.errors import ConfigError, ConfigFileNotFoundError


def _parse_text(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}",
                source=str(path),
            ) from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(
            f"is not valid YAML: {problem}{where}",
            source=str(path),
            fix="Fix the file or write a fresh one with `accel config`",
        ) from None


def read_config_file(
    path: str | os.PathLike[str], warnings: list[str] | None = None
) -> AccelConfig:
    """Parse and validate one config file.

    Args:
        path: The YAML (or ``.json``) file.
        warnings: Receives one line per unknown or ignored key.

    Raises:
        ConfigError: The file is missing, unreadable, not YAML, not a mapping, or holds an invalid
            value (the message names the file, key, value and allowed values).
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileNotFoundError(
            "config file does not exist",
            source=str(file),
            fix="Write one with `accel config` (or `accel config default`), or fix the path",
        ) from None
    except OSError as error:
        raise ConfigError(f"cannot be read ({error.strerror})", source=str(file)) from None
    data = _parse_text(file, text)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"must hold a mapping of keys to values at the top level, not {type(data).__name__}",
            source=str(file),
        )
    notes: list[str] = []
    try:
        config = AccelConfig.from_mapping(data, namer=file_key(""), warnings=notes)
    except ConfigError as error:
        raise error.with_source(str(file)) from None
    if warnings is not None:
        warnings.extend(f"{file}: {note}" for note in notes)
    return config


def load_config(
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    warnings: list[str] | None = None,
) -> tuple[AccelConfig, ConfigLocation]:
    """Find (see :func:`~accel_launch.config.paths.locate_config_file`) and read the config.

    Returns:
        The parsed config (empty when there is no file) and where it came from.
    """
    location = locate_config_file(config_file, environ)
    if location.path is None:
        return AccelConfig(), location
    return read_config_file(location.path, warnings), location


def write_config_file(config: AccelConfig, path: str | os.PathLike[str]) -> Path:
    """Write ``config`` (set keys only, sorted) to ``path``, creating folders; return the path."""
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    data = config.to_dict()
    if file.suffix.lower() == ".json":
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    else:
        import yaml

        text = yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, file)
    return file
