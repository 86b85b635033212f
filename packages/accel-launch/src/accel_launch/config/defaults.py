"""``accel config default``: a config for this machine written without asking anything."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from accel_launch.config.files import write_config_file
from accel_launch.config.paths import default_config_file
from accel_launch.config.schema import AccelConfig
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
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """Write :func:`basic_config` to ``config_file`` (default location when ``None``).

    Returns:
        The path written, or ``None`` when a file is already there (it is never overwritten).
    """
    path = Path(config_file).expanduser() if config_file else default_config_file(environ)
    if path.exists():
        return None
    return write_config_file(basic_config(mixed_precision), path)
