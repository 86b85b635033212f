"""Where config files live.

The folder is ``$HF_HOME/accel``, else ``$XDG_CACHE_HOME/huggingface/accel``, else
``~/.cache/huggingface/accel``; the file is ``default_config.yaml``.

``ACCEL_CONFIG_FILE`` (a user setting read by the CLI, not part of the launcher-to-worker contract)
names a different default file. When no accel file exists but Accelerate's default does (the same
folders ending in ``accelerate``), that one is read instead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

CONFIG_FILE_NAME = "default_config.yaml"
CONFIG_FILE_VARIABLE = "ACCEL_CONFIG_FILE"
TOOL_FOLDER = "accel"
ACCELERATE_FOLDER = "accelerate"


def cache_folder(tool: str = TOOL_FOLDER, environ: Mapping[str, str] | None = None) -> Path:
    """The folder holding ``tool``'s default config, by the precedence in the module docstring."""
    env = os.environ if environ is None else environ
    if env.get("HF_HOME"):
        base = Path(env["HF_HOME"]).expanduser()
    elif env.get("XDG_CACHE_HOME"):
        base = Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface"
    else:
        base = Path("~/.cache/huggingface").expanduser()
    return base / tool


def default_config_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``accel config`` writes and ``accel launch`` looks when no file is named."""
    env = os.environ if environ is None else environ
    if env.get(CONFIG_FILE_VARIABLE):
        return Path(env[CONFIG_FILE_VARIABLE]).expanduser()
    return cache_folder(TOOL_FOLDER, env) / CONFIG_FILE_NAME


def accelerate_config_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where Accelerate keeps its default config."""
    return cache_folder(ACCELERATE_FOLDER, environ) / CONFIG_FILE_NAME


@dataclasses.dataclass(frozen=True)
class ConfigLocation:
    """The config file chosen for a command, and how it was chosen.

    Attributes:
        path: The file to read, or ``None`` when there is none (defaults apply).
        explicit: Whether the user named it (``--config_file``): then it must exist.
        note: A line to show the user, e.g. that Accelerate's file is being used.
    """

    path: Path | None
    explicit: bool = False
    note: str | None = None


def locate_config_file(
    config_file: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
) -> ConfigLocation:
    """Pick the config file: the named one, else accel's default, else Accelerate's default."""
    if config_file:
        return ConfigLocation(Path(config_file).expanduser(), explicit=True)
    ours = default_config_file(environ)
    if ours.is_file():
        return ConfigLocation(ours)
    theirs = accelerate_config_file(environ)
    if theirs.is_file():
        return ConfigLocation(
            theirs,
            note=(
                f"no accel config at {ours}; using Accelerate's config at {theirs} "
                "(run `accel config` to write one of our own)"
            ),
        )
    return ConfigLocation(None)
