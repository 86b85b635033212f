"""Processes started by ``mpirun``: Open MPI, and MPICH / Intel MPI through PMI."""

from __future__ import annotations

from collections.abc import Mapping

from accel_state.cluster.base import (
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    ClusterEnvironment,
    ProcessLayout,
    node_count,
)
from accel_state.envvars import read_int
from accel_state.errors import EnvironmentConfigError


def _mpi_layout(
    environ: Mapping[str, str],
    source: str,
    rank_name: str,
    size_name: str,
    local_rank_name: str,
    local_size_name: str,
) -> ProcessLayout:
    world_size = read_int(environ, size_name, minimum=1)
    rank = read_int(environ, rank_name, minimum=0)
    local_rank = read_int(environ, local_rank_name, default=rank, minimum=0)
    local_world_size = read_int(environ, local_size_name, default=world_size, minimum=1)
    num_nodes = node_count(world_size, local_world_size, source)
    master_addr = environ.get("MASTER_ADDR", "")
    if not master_addr:
        if num_nodes > 1:
            raise EnvironmentConfigError(
                f"{source}: a {num_nodes}-machine MPI job needs MASTER_ADDR (the address of the "
                "machine running rank 0); pass it with mpirun -x MASTER_ADDR=<host>."
            )
        master_addr = DEFAULT_MASTER_ADDR
    return ProcessLayout(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=rank // local_world_size,
        num_nodes=num_nodes,
        master_addr=master_addr,
        master_port=read_int(environ, "MASTER_PORT", default=DEFAULT_MASTER_PORT, minimum=1),
        source=source,
    )


class OpenMPIEnvironment(ClusterEnvironment):
    """Reads ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK`` and ``_LOCAL_SIZE``."""

    name = "openmpi"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """True under Open MPI's ``mpirun``."""
        return "OMPI_COMM_WORLD_SIZE" in environ

    @classmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Read Open MPI's variables; ``MASTER_ADDR`` is required across machines."""
        return _mpi_layout(
            environ,
            cls.name,
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )


class MPICHEnvironment(ClusterEnvironment):
    """MPICH, Intel MPI and other PMI launchers.

    Reads ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` and ``MPI_LOCALNRANKS``.
    """

    name = "mpich"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """True under a PMI launcher (Hydra's ``mpiexec``)."""
        return "PMI_SIZE" in environ and "PMI_RANK" in environ

    @classmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Read the PMI variables; ``MASTER_ADDR`` is required across machines."""
        return _mpi_layout(
            environ, cls.name, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"
        )
