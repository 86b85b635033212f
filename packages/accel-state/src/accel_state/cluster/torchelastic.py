"""Processes started by ``torchrun`` / torch elastic (or anything that exports the same variables)."""

from __future__ import annotations

from collections.abc import Mapping

from accel_state.cluster.base import (
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    ClusterEnvironment,
    ProcessLayout,
)
from accel_state.envvars import read_int
from accel_state.errors import EnvironmentConfigError


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by torchrun.

    Reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
    ``GROUP_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
    """

    name = "torchelastic"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """True when ``RANK`` or ``WORLD_SIZE`` is exported."""
        return "RANK" in environ or "WORLD_SIZE" in environ

    @classmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Read the torchrun variables; a half-set group (RANK without WORLD_SIZE) is an error."""
        missing = [name for name in ("RANK", "WORLD_SIZE") if name not in environ]
        if missing:
            raise EnvironmentConfigError(
                f"torchrun-style launch detected but {' and '.join(missing)} is not set; "
                "export RANK and WORLD_SIZE together (or neither for a single process)."
            )
        world_size = read_int(environ, "WORLD_SIZE", minimum=1)
        rank = read_int(environ, "RANK", minimum=0)
        local_rank = read_int(environ, "LOCAL_RANK", default=rank, minimum=0)
        local_world_size = read_int(environ, "LOCAL_WORLD_SIZE", default=world_size, minimum=1)
        node_rank = read_int(environ, "GROUP_RANK", default=0, minimum=0)
        if "GROUP_WORLD_SIZE" in environ:
            num_nodes = read_int(environ, "GROUP_WORLD_SIZE", minimum=1)
        else:
            num_nodes = max(1, world_size // local_world_size)
        master_port = read_int(environ, "MASTER_PORT", default=DEFAULT_MASTER_PORT, minimum=1)
        return ProcessLayout(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=environ.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
            master_port=master_port,
            source=cls.name,
        )
