"""Accelerate's ``accelerate.commands.config.config_args``: config files as dataclasses.

:class:`ClusterConfig` holds Accelerate's keys of a local-machine config file. Files are checked
by accel-launch's config reader first (a bad value raises
:class:`~accel_launch.errors.ConfigError` naming the key, the value and what is allowed); keys
that are not fields of the class are left out with a warning in the log. :class:`SageMakerConfig`
exists for the name and refuses to be built: accel does not launch on Amazon SageMaker.

Example:
    >>> from accel.commands.config.config_args import ClusterConfig
    >>> ClusterConfig("LOCAL_MACHINE", "MULTI_CPU", "no", True, False, num_processes=2).to_dict()[
    ...     "distributed_type"
    ... ]
    'MULTI_CPU'
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, TypeVar

from accel_launch.config.files import read_config_file
from accel_launch.config.paths import CONFIG_FILE_NAME, cache_folder, locate_config_file
from accel_launch.errors import LaunchArgumentError
from accel_state.types import ComputeEnvironment, DistributedType

logger = logging.getLogger(__name__)
C = TypeVar("C", bound="BaseConfig")

#: Folders and files by Accelerate's names (accel's cache folder, as it was at import).
cache_dir = str(cache_folder())
hf_cache_home = os.path.dirname(cache_dir)
default_json_config_file = os.path.join(cache_dir, CONFIG_FILE_NAME)
default_yaml_config_file = default_json_config_file
default_config_file = default_yaml_config_file

_BASE_DEFAULTS: dict[str, Any] = {
    "compute_environment": ComputeEnvironment.LOCAL_MACHINE.value,
    "distributed_type": DistributedType.NO.value,
    "mixed_precision": "no",
    "use_cpu": False,
    "debug": False,
}


def _refuse_sagemaker(what: str) -> LaunchArgumentError:
    return LaunchArgumentError(
        f"{what}: Amazon SageMaker launches are not supported by accel (compute_environment "
        "AMAZON_SAGEMAKER); use LOCAL_MACHINE and run `accel launch` on the machines themselves."
    )


@dataclasses.dataclass
class BaseConfig:
    """The keys every config file has; reads and writes YAML and JSON files."""

    compute_environment: ComputeEnvironment
    distributed_type: DistributedType | str
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        self.compute_environment = ComputeEnvironment(self.compute_environment)
        if self.distributed_type in DistributedType.list() or self.distributed_type == "TPU":
            self.distributed_type = DistributedType[str(self.distributed_type)]
        self.mixed_precision = str(self.mixed_precision).lower()

    def to_dict(self) -> dict[str, Any]:
        """The set fields, enums as their values; empty sections are left out, as Accelerate's.

        ``transformers env`` and ``trl env`` print this dict, so it lists exactly Accelerate's keys.
        """
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = _plain(getattr(self, field.name))
            if value is not None:
                out[field.name] = value
        return out

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """``config_dict`` with the base keys it lacks filled in with their defaults."""
        return {**_BASE_DEFAULTS, **{k: v for k, v in config_dict.items() if v is not None}}

    @classmethod
    def from_mapping(cls: type[C], data: dict[str, Any], source: str = "config") -> C:
        """Build from a file's keys; keys that are not fields are logged and left out."""
        names = {field.name for field in dataclasses.fields(cls)}
        dropped = sorted(set(data) - names)
        if dropped:
            logger.warning("%s: keys %s are not fields of %s", source, dropped, cls.__name__)
        return cls(**cls.process_config({k: v for k, v in data.items() if k in names}))

    @classmethod
    def _from_file(cls: type[C], path: str | os.PathLike[str]) -> C:
        read_config_file(path)  # raises ConfigError on a value accel-launch refuses
        return cls.from_mapping(_read_mapping(Path(path)), str(path))

    @classmethod
    def from_json_file(cls: type[C], json_file: str | None = None) -> C:
        """Read a JSON config file (default: :data:`default_json_config_file`)."""
        return cls._from_file(json_file or default_json_config_file)

    @classmethod
    def from_yaml_file(cls: type[C], yaml_file: str | None = None) -> C:
        """Read a YAML config file (default: :data:`default_yaml_config_file`)."""
        return cls._from_file(yaml_file or default_yaml_config_file)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the set fields as JSON."""
        Path(json_file).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the set fields as YAML."""
        import yaml

        Path(yaml_file).write_text(yaml.safe_dump(self.to_dict(), sort_keys=True))


def _read_mapping(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    return dict(data or {})


@dataclasses.dataclass
class ClusterConfig(BaseConfig):
    """A local-machine config file: processes, machines, and each feature's settings."""

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict[str, Any] | None = None
    deepspeed_config: dict[str, Any] | None = None
    fsdp_config: dict[str, Any] | None = None
    parallelism_config: dict[str, Any] | None = None
    megatron_lm_config: dict[str, Any] | None = None
    mpirun_config: dict[str, Any] | None = None
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "dynamo_config"):
            if getattr(self, name) is None:
                setattr(self, name, {})


@dataclasses.dataclass
class SageMakerConfig(BaseConfig):
    """Accelerate's SageMaker config; accel refuses it (see the module docstring)."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = "1.10.2"
    transformers_version: str = "4.17.0"
    py_version: str = "py38"
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict[str, Any] | None = None
    dynamo_config: dict[str, Any] | None = None
    enable_cpu_affinity: bool = False

    def __post_init__(self) -> None:
        raise _refuse_sagemaker("SageMakerConfig")


def _plain(value: Any) -> Any:
    """``value`` with enums as their values and empty mappings, at any depth, as None."""
    value = getattr(value, "value", value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()} or None
    return value


def load_config_from_file(config_file: str | None) -> ClusterConfig:
    """Read ``config_file`` (or the default one) as a :class:`ClusterConfig`.

    Raises:
        FileNotFoundError: ``config_file`` (or, without it, any default file) does not exist.
        accel_launch.errors.LaunchArgumentError: The file is a SageMaker config.
        accel_launch.errors.ConfigError: The file holds an invalid value.
    """
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"The passed configuration file `{config_file}` does not exist; pass an existing "
            "file or write one with `accel config`."
        )
    path = locate_config_file(config_file).path
    if path is None:
        raise FileNotFoundError(
            f"No config file at {default_config_file}; write one with `accel config`."
        )
    data = _read_mapping(Path(path))
    if data.get("compute_environment") == ComputeEnvironment.AMAZON_SAGEMAKER.value:
        raise _refuse_sagemaker(f"load_config_from_file({str(path)!r})")
    return ClusterConfig._from_file(path)


__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "cache_dir",
    "default_config_file",
    "default_json_config_file",
    "default_yaml_config_file",
    "hf_cache_home",
    "load_config_from_file",
]
