"""The Accelerator's N-D parallelism surface: the mesh, each dimension's rank, context parallelism."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from accel.accelerator_state import AcceleratorState
from accel.errors import UnsupportedFeatureError
from accel.strategies.base import ModelStrategy
from accel_state import ParallelismConfig
from accel_state.device_mesh import ParallelMesh


class ParallelismMixin:
    """The Accelerator's mesh, per-dimension ranks and context parallelism (Accelerate's names).

    The host class provides ``state`` and ``strategy``.
    """

    state: AcceleratorState
    strategy: ModelStrategy

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        """The job's ``ParallelismConfig``, its degrees fitted to the job; ``None`` without one."""
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The job's ``DeviceMesh``, else ``None``.

        Its dimensions are the enabled ones of ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; the
        flattened ``dp``, ``dp_shard_cp`` and ``dp_cp`` meshes are built with it.
        """
        return self.state.device_mesh

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether models are prepared the composable way: FSDP2 and/or DTensor TP/CP on a mesh."""
        from accel.strategies.fsdp.strategy import FSDPStrategy

        strategy = self.strategy
        return isinstance(strategy, FSDPStrategy) and strategy.fsdp.fsdp_version == 2

    def _mesh_rank(self, dim: str, what: str) -> int:
        mesh: ParallelMesh | None = self.state.parallel_mesh
        if mesh is None:
            raise UnsupportedFeatureError(
                f"{what} is not configured: pass Accelerator(parallelism_config=ParallelismConfig"
                "(...)) or launch with --use_parallelism_config."
            )
        return mesh.local_rank(dim)

    @property
    def data_parallel_rank(self) -> int:
        """This process's index on ``dp_replicate`` (0 when that dimension is 1), as in Accelerate.

        Raises:
            UnsupportedFeatureError: No ``parallelism_config``.
        """
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index on ``dp_shard`` (0 when that dimension is 1).

        Raises:
            UnsupportedFeatureError: No ``parallelism_config``.
        """
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index on ``tp`` (0 when that dimension is 1).

        Raises:
            UnsupportedFeatureError: No ``parallelism_config``.
        """
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index on ``cp`` (0 when that dimension is 1).

        Raises:
            UnsupportedFeatureError: No ``parallelism_config``.
        """
        return self._mesh_rank("cp", "Context parallelism")

    @property
    def pipeline_parallel_rank(self) -> int:
        """Pipeline parallelism is not a ``ParallelismConfig`` dimension (nor in Accelerate).

        Raises:
            UnsupportedFeatureError: Always; pipelined inference is ``accel.inference.prepare_pippy``.
        """
        raise UnsupportedFeatureError(
            "Pipeline parallelism is not a ParallelismConfig dimension (Accelerate raises here "
            "too); for pipelined inference use accel.inference.prepare_pippy."
        )

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: Iterable[torch.Tensor] | None = None,
        buffer_seq_dims: Iterable[int] | None = None,
        no_restore_buffers: Iterable[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Split ``buffers`` over ``cp`` for the block (ring attention); else run it as it is.

        Args:
            buffers: Tensors of the step (inputs, labels, position ids) to shard in place.
            buffer_seq_dims: The sequence dimension of each buffer (default 1).
            no_restore_buffers: Buffers left sharded after the block.
        """
        config = self.parallelism_config
        mesh = self.state.parallel_mesh
        if config is None or mesh is None or not config.cp_enabled:
            yield
            return
        from accel.strategies.mesh.context_parallel import context_parallel_block

        handler = config.cp_handler
        strategy = "allgather" if handler is None else str(handler.cp_comm_strategy)
        with context_parallel_block(
            mesh.get_mesh("cp"), strategy, buffers, buffer_seq_dims, no_restore_buffers
        ):
            yield
