"""Exception hierarchy of accel-launch: every error this package raises derives from AccelLaunchError."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accel_state.errors import TorchFeatureError


class AccelLaunchError(Exception):
    """Base class of every error raised by accel-launch."""


class ConfigError(AccelLaunchError, ValueError):
    """A config file or command-line value is missing, malformed or outside what it accepts.

    Attributes:
        key: The key (``fsdp_config.fsdp_sharding_strategy``) or flag (``--zero_stage``).
        value: The offending value.
        allowed: What would have been accepted, when that is a short list.
        source: Where the value came from: a file path or ``"command line"``.
        reason: What is wrong, in words.
    """

    def __init__(
        self,
        reason: str,
        *,
        key: str | None = None,
        value: Any = None,
        allowed: Sequence[str] | None = None,
        source: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.reason = reason
        self.key = key
        self.value = value
        self.allowed = list(allowed) if allowed is not None else None
        self.source = source
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.source:
            parts.append(f"{self.source}: ")
        if self.key is not None:
            parts.append(f"{self.key}={self.value!r}: ")
        parts.append(self.reason)
        if self.allowed:
            parts.append(f"; allowed: {', '.join(self.allowed)}")
        if self.fix:
            parts.append(f". {self.fix}")
        return "".join(parts)

    def with_source(self, source: str) -> ConfigError:
        """Return a copy naming ``source`` (a file path), unless one is already named."""
        if self.source:
            return self
        return ConfigError(
            self.reason,
            key=self.key,
            value=self.value,
            allowed=self.allowed,
            source=source,
            fix=self.fix,
        )


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """The config file named (``--config_file``) does not exist; a ``FileNotFoundError`` too."""


class LaunchArgumentError(AccelLaunchError, ValueError):
    """The launch flags contradict each other or cannot be satisfied on this machine."""


class OutputFileExistsError(LaunchArgumentError, FileExistsError):
    """The output file exists and overwriting was not asked for; a ``FileExistsError`` too."""


class LaunchTorchFeatureError(AccelLaunchError, TorchFeatureError):
    """A launch option needs a newer torch than the one installed (its gate names which)."""


class MissingDependencyError(AccelLaunchError, ImportError):
    """An optional library needed by the requested code path is not installed."""


class JobFailedError(AccelLaunchError, RuntimeError):
    """Launched workers failed; ``exit_code`` is what the launcher should exit with."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NotebookLaunchError(AccelLaunchError, RuntimeError):
    """``notebook_launcher`` cannot fork workers from this interpreter as it is."""
