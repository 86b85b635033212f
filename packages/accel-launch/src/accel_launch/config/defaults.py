"""``accel config default``: a config for this machine written without asking anything."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from accel_launch.config.files import write_config_file
from accel_launch.config.paths import default_config_file
from accel_launch.config.schema import AccelConfig
from accel_launch.errors import ConfigError
from accel_launch.hardware import visible_gpu_count
from accel_state.types import ComputeEnvironment, DistributedType


def basic_config(mixed_precision: str = "no", gpus: int | None = None) -> AccelConfig:
    """All GPUs of this machine (a multi-GPU job when there are several), else one CPU process."""
    count = visible_gpu_count() if gpus is None else gpus
    if count > 1:
        kind, processes, use_cpu = DistributedType.MULTI_GPU, count, False
    else:
        kind, processes, use_cpu = DistributedType.NO, 1, count == 0
    return AccelConfig(
        compute_environment=ComputeEnvironment.LOCAL_MACHINE.value,
        distributed_type=kind.value,
        mixed_precision=mixed_precision,
        use_cpu=use_cpu,
        debug=False,
        num_processes=processes,
        num_machines=1,
        machine_rank=0,
        gpu_ids="all" if count else None,
        rdzv_backend="static",
        same_network=True,
        main_training_function="main",
        downcast_bf16=False,
    )


def write_basic_config(
    mixed_precision: str = "no",
    save_location: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
) -> Path | None:
    """Write :func:`basic_config` to ``save_location`` (default location when ``None``).

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        save_location: Where to write the YAML file (Accelerate's name for the argument).
        environ: The variables that locate the default file (``os.environ`` when ``None``).
        config_file: The same as ``save_location`` (accel's earlier name; give one of them).

    Returns:
        The path written, or ``None`` when a file is already there (it is never overwritten).
    """
    if save_location is not None and config_file is not None:
        raise ConfigError(
            f"write_basic_config(save_location={save_location!r}, config_file={config_file!r}): "
            "both name the file to write; pass save_location only."
        )
    target = save_location if save_location is not None else config_file
    path = Path(target).expanduser() if target else default_config_file(environ)
    if path.exists():
        return None
    return write_config_file(basic_config(mixed_precision), path)
