"""The launcher variables a test strips so that a process (or a job it starts) begins plain."""

from __future__ import annotations

from collections.abc import Mapping

#: Variables through which a launcher tells a process its place in a job.
LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMI_RANK",
    "PJRT_DEVICE",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_RESTART_COUNT",
    "SLURM_STEP_NUM_TASKS",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)


#: Prefixes of the settings variables dropped with ``ACCEL_*``: Accelerate's N-D parallelism
#: settings, which the launcher writes under Accelerate's own names.
SETTINGS_PREFIXES = ("ACCEL_", "PARALLELISM_CONFIG_", "ACCELERATE_USE_PARALLELISM_CONFIG")


def without_launcher_variables(
    environ: Mapping[str, str], drop_accel: bool = True
) -> dict[str, str]:
    """A copy of ``environ`` without :data:`LAUNCHER_VARIABLES` (and settings unless asked)."""
    return {
        name: value
        for name, value in environ.items()
        if name not in LAUNCHER_VARIABLES
        and not (drop_accel and name.startswith(SETTINGS_PREFIXES))
    }
