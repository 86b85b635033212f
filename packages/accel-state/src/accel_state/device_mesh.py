"""``ParallelMesh``: every ``DeviceMesh`` of one :class:`~accel_state.ParallelismConfig`.

One object owns the meshes of a job (torchtitan's ``ParallelDims`` habit): the world mesh of the
enabled dimensions and the flattened ``dp``, ``dp_shard_cp`` and ``dp_cp`` meshes, built together
on first use (a collective: every rank must reach it; the Accelerator builds it when it is
created) and then looked up by Accelerate's names with :meth:`ParallelMesh.get_mesh`. It does
not touch modules.

It also answers "who am I in which dimension" without building anything, from the rank and the
mesh layout, which is how the data path (loaders, ``gather_for_metrics``) finds the data-parallel
rank and size: :class:`~accel_state.PartialState` asks the active mesh (:func:`activate`).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from accel_state.errors import ParallelismConfigError
from accel_state.group_keeper import GroupHolders
from accel_state.shared import shared_dict

if TYPE_CHECKING:  # the config builds meshes through this module, not the other way round
    from accel_state.parallelism_config import ParallelismConfig

_ACTIVE = shared_dict("ParallelMesh")


def _flattened_dims(config: ParallelismConfig) -> dict[str, list[str]]:
    """Accelerate's flattened meshes and the dimensions each one joins."""
    return {
        "dp": config.dp_dim_names,
        "dp_shard_cp": config.dp_shard_cp_dim_names,
        "dp_cp": config.dp_cp_dim_names,
    }


class ParallelMesh:
    """The meshes of one job, built once, looked up by dimension name.

    Args:
        config: The degrees; resolved against ``world_size`` here (see
            :meth:`ParallelismConfig.resolve`) when not yet.
        device_type: ``"cuda"``, ``"cpu"``... (the mesh's device type).
        world_size: Processes in the job (default: the process group's, else 1).
        rank: This process's global rank (default: the process group's, else 0).

    Raises:
        ParallelismConfigError: The degrees do not multiply to ``world_size``.
    """

    def __init__(
        self,
        config: ParallelismConfig,
        device_type: str,
        *,
        world_size: int | None = None,
        rank: int | None = None,
    ) -> None:
        initialized = dist.is_available() and dist.is_initialized()
        if world_size is None and not initialized:
            # No process group yet: a fully given config is trusted (torch's init_device_mesh
            # starts the group and checks it), as Accelerate's build_device_mesh does.
            world_size = config.total_size if config.fully_given else 1
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if initialized else 1)
        )
        self.rank = rank if rank is not None else (dist.get_rank() if initialized else 0)
        self.config = config.resolve(self.world_size)
        self.device_type = device_type
        self.names, self.shape = config.mesh_layout()
        self._world: Any = None
        self._flattened: dict[str, Any] = {}
        self._built = False

    # ------------------------------------------------------------------ building
    def build(self) -> Any:
        """Build the meshes (collective on first call; every rank must call it); returns the world mesh.

        Raises:
            TorchFeatureError: torch is older than 2.5 (``torch_compat.GATES["device_mesh"]``).
        """
        if self._built:
            return self._world
        if self.names:
            from torch.distributed.device_mesh import init_device_mesh

            from accel_state.torch_compat import GATES

            GATES["device_mesh"].require(device_type=self.device_type)

            self._world = init_device_mesh(self.device_type, self.shape, mesh_dim_names=self.names)
            for name, dims in _flattened_dims(self.config).items():
                if dims:
                    self._flattened[name] = self._world[list(dims)]._flatten(name)
            _BUILT.add(self)
        self._built = True
        return self._world

    def release_groups(self) -> None:
        """Drop the meshes' references to their process groups (after the groups are destroyed).

        A ``DeviceMesh`` keeps its groups in a registry, and every DTensor holds its mesh, so a
        destroyed group would outlive the interpreter with its gloo worker threads, and one that
        still finishes a collective then aborts the process ("terminate called without an active
        exception"). Freed here, each group joins its threads. The meshes cannot communicate
        afterwards.
        """
        for mesh in [self._world, *self._flattened.values()]:
            if mesh is not None:
                _clear_registry(mesh)
                _clear_registry(getattr(mesh, "_root_mesh", None))

    @property
    def world_mesh(self) -> Any:
        """The ``DeviceMesh`` of the enabled dimensions (``None`` when none is enabled)."""
        return self.build()

    def get_optional_mesh(self, name: str | Sequence[str]) -> Any:
        """The mesh of ``name``, or ``None`` when it is not enabled.

        ``name`` is a dimension, a flattened one (``dp``, ``dp_shard_cp``, ``dp_cp``) or a
        sequence of dimensions.
        """
        names = (name,) if isinstance(name, str) else tuple(name)
        world = self.build()
        if len(names) == 1 and names[0] in self._flattened:
            return self._flattened[names[0]]
        if world is None or not names or not all(part in self.names for part in names):
            return None
        return world[names]

    def get_mesh(self, name: str | Sequence[str]) -> Any:
        """The mesh of ``name``, as :meth:`get_optional_mesh`.

        Raises:
            ParallelismConfigError: That dimension is not enabled (size 1) or unknown.
        """
        mesh = self.get_optional_mesh(name)
        if mesh is None:
            raise ParallelismConfigError(
                f"Mesh {name!r} is not available ({self.config.describe()}). Ensure the "
                "corresponding parallelism dimension is enabled (size > 1); meshes here: "
                f"{list(self.names) + list(self._flattened)}."
            )
        return mesh

    def fsdp_mesh(self) -> Any:
        """The mesh FSDP2 shards over: ``dp_shard_cp``, with ``dp_replicate`` first for HSDP.

        Raises:
            ParallelismConfigError: No dimension shards parameters.
        """
        shard = self.get_mesh("dp_shard_cp")
        if not self.config.dp_replicate_enabled:
            return shard
        shard_dims = self.config.dp_shard_cp_dim_names
        if len(shard_dims) == 1:
            return self.get_mesh(("dp_replicate", shard_dims[0]))
        # dp_shard_cp flattens several dimensions: join it to dp_replicate on the world mesh.
        return self.build()[("dp_replicate", "dp_shard_cp")]

    # ------------------------------------------------------------------ coordinates, no mesh needed
    def local_rank(self, name: str | Sequence[str]) -> int:
        """This process's index along ``name`` (several dimensions: flattened); 0 when disabled."""
        names = _flattened_dims(self.config).get(name, [name]) if isinstance(name, str) else name
        coordinates = _unravel(self.rank, self.shape)
        index = 0
        for dim in names:
            if dim in self.names:
                position = self.names.index(dim)
                index = index * self.shape[position] + coordinates[position]
        return index

    def size(self, name: str | Sequence[str]) -> int:
        """Processes along ``name`` (several dimensions, or a flattened name: their product)."""
        names = _flattened_dims(self.config).get(name, [name]) if isinstance(name, str) else name
        return math.prod(self.shape[self.names.index(dim)] for dim in names if dim in self.names)

    @property
    def data_parallel_size(self) -> int:
        """Distinct batches per step: ``dp_replicate x dp_shard``."""
        return self.config.data_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        """Which of those batches this process gets (its index on the flattened ``dp`` mesh)."""
        return self.local_rank("dp")

    def data_parallel_group(self) -> Any:
        """The process group of this rank's ``dp`` mesh; ``None`` when that is every process.

        Ranks of one tensor/context-parallel group hold the same batch, so metrics are gathered
        over this group only.

        Raises:
            ParallelismConfigError: There is no data parallelism (``data_parallel_size == 1``)
                while other dimensions are enabled: no collective is needed then.
        """
        if self.config.non_data_parallel_size == 1:
            return None
        if self.data_parallel_size == 1:
            raise ParallelismConfigError(
                f"No data-parallel group in {self.config.describe()}: every process holds the "
                "same batch; check data_parallel_size before gathering."
            )
        return self.get_mesh("dp").get_group()

    def __repr__(self) -> str:
        return (
            f"ParallelMesh({self.config.describe()}, device_type={self.device_type!r}, "
            f"rank={self.rank})"
        )


def _release_mesh_groups(meshes: list[ParallelMesh]) -> None:
    """Free the destroyed groups from ``meshes`` (run by ``free_destroyed_groups``)."""
    for mesh in meshes:
        mesh.release_groups()
    # Meshes made from these groups elsewhere (slices, DeviceMesh.from_group by FSDP or the
    # checkpoint helpers, meshes kept in torch's sharding caches) hold them in registries too.
    from torch.distributed.device_mesh import DeviceMesh

    for obj in gc.get_objects():
        if isinstance(obj, DeviceMesh):
            _clear_registry(obj)


#: Every mesh built in this process, whose groups :func:`_release_mesh_groups` frees.
_BUILT = GroupHolders(_release_mesh_groups)


def _clear_registry(mesh: Any) -> None:
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()


def _unravel(rank: int, shape: Sequence[int]) -> list[int]:
    """Row-major coordinates of ``rank`` in a grid of ``shape`` (how ``init_device_mesh`` lays ranks)."""
    coordinates = []
    for size in reversed(shape):
        coordinates.append(rank % size)
        rank //= size
    return list(reversed(coordinates))


# ---------------------------------------------------------------------- the job's active mesh
def activate(mesh: ParallelMesh | None) -> None:
    """Make ``mesh`` the job's mesh: the data path follows its data-parallel layout."""
    if mesh is None:
        _ACTIVE.clear()
    else:
        _ACTIVE["mesh"] = mesh


def active_parallel_mesh() -> ParallelMesh | None:
    """The mesh :func:`activate` installed in this process, if any."""
    mesh = _ACTIVE.get("mesh")
    return mesh if isinstance(mesh, ParallelMesh) else None


__all__ = ["ParallelMesh", "activate", "active_parallel_mesh"]
