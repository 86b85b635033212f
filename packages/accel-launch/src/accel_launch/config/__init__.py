"""Config files in Accelerate's format: schema, locations, reading and writing."""

from accel_launch.config.files import load_config, read_config_file, write_config_file
from accel_launch.config.paths import (
    ConfigLocation,
    accelerate_config_file,
    cache_folder,
    default_config_file,
    locate_config_file,
)
from accel_launch.config.schema import (
    AccelConfig,
    DeepSpeedConfig,
    DynamoConfig,
    FsdpConfig,
    ParallelismSection,
)

__all__ = [
    "AccelConfig",
    "ConfigLocation",
    "DeepSpeedConfig",
    "DynamoConfig",
    "FsdpConfig",
    "ParallelismSection",
    "accelerate_config_file",
    "cache_folder",
    "default_config_file",
    "load_config",
    "locate_config_file",
    "read_config_file",
    "write_config_file",
]
