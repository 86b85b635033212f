"""accel-launch: one launcher for any torch script, its config files, and notebook launchers.

Commands: ``accel launch``, ``accel config``, ``accel test``, ``accel env`` (and ``accel-launch``).
Config files use Accelerate's format.

Example:
    >>> from accel_launch import notebook_launcher
    >>> def train():
    ...     ...
    >>> notebook_launcher(train, num_processes=2)  # doctest: +SKIP

Importing this package does not import torch; the launchers import it when called.
"""

from accel_launch.__about__ import __version__
from accel_launch.config import AccelConfig, DeepSpeedConfig, DynamoConfig, FsdpConfig, load_config
from accel_launch.errors import (
    AccelLaunchError,
    ConfigError,
    ConfigFileNotFoundError,
    JobFailedError,
    LaunchArgumentError,
    MissingDependencyError,
    NotebookLaunchError,
    OutputFileExistsError,
)
from accel_launch.notebook import debug_launcher, notebook_launcher

__all__ = [
    "AccelConfig",
    "AccelLaunchError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "DeepSpeedConfig",
    "DynamoConfig",
    "FsdpConfig",
    "JobFailedError",
    "LaunchArgumentError",
    "MissingDependencyError",
    "NotebookLaunchError",
    "OutputFileExistsError",
    "__version__",
    "debug_launcher",
    "load_config",
    "notebook_launcher",
]
