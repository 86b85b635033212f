"""From ``Accelerator(parallelism_config=...)`` (or the launcher's settings) to the job's mesh.

:func:`requested_config` finds the ``ParallelismConfig`` a job asks for, :func:`check_supported`
refuses what cannot run (with the reason), and :func:`build_parallel_mesh` fits the degrees to
the job, builds the meshes on every rank and makes them the job's active mesh, which the data path
follows. Applying tensor/context parallelism and FSDP2 to models is the mesh strategy's job
(:mod:`accel.strategies.mesh.strategy`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel_state import DistributedType, ParallelismConfig, PartialState
from accel_state.contract import LaunchContract
from accel_state.device_mesh import ParallelMesh, activate

SEQUENCE_PARALLEL_REASON = (
    "sp_size={size} (sequence parallelism, sp_backend={backend!r}) is not supported by accel. "
    "DeepSpeed 0.19.8's ALST/Ulysses (deepspeed.runtime.sequence_parallel.ulysses_sp."
    "UlyssesSPAttentionHF) works by registering an attention implementation with Hugging Face "
    "transformers (>= 4.51.3) models and wrapping their dataloaders, so it does not apply to "
    "plain torch models, and accel does not depend on transformers; Accelerate's own Ulysses "
    "backend ('accelerate') is not implemented in accel either. To split long sequences use "
    "cp_size (context parallelism, CUDA), or set sp_size=1."
)


@dataclasses.dataclass
class TorchTensorParallelPlugin:
    """Accelerate's older request for tensor parallelism; it becomes ``ParallelismConfig(tp_size=...)``.

    Args:
        tp_size: Tensor-parallel degree.
        torch_device_mesh: Filled with the job's mesh once the Accelerator is built.
    """

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise AcceleratorConfigError(
                f"TorchTensorParallelPlugin(tp_size={self.tp_size!r}) must be an integer >= 1."
            )


def requested_config(parallelism_config: Any, torch_tp_plugin: Any) -> ParallelismConfig | None:
    """The ``ParallelismConfig`` an Accelerator is given: the argument or the TP plugin's.

    Without either, the state falls back to the launcher's (:func:`launcher_config`).

    Raises:
        AcceleratorConfigError: Both arguments given, or an argument of the wrong type.
    """
    if parallelism_config is not None and torch_tp_plugin is not None:
        raise AcceleratorConfigError(
            "parallelism_config and torch_tp_plugin were both given; pass "
            "ParallelismConfig(tp_size=...) alone (TorchTensorParallelPlugin is its older form)."
        )
    if parallelism_config is not None:
        if not isinstance(parallelism_config, ParallelismConfig):
            raise AcceleratorConfigError(
                f"parallelism_config={parallelism_config!r}: pass an accel.ParallelismConfig."
            )
        return parallelism_config
    if torch_tp_plugin is not None:
        if not isinstance(torch_tp_plugin, TorchTensorParallelPlugin):
            raise AcceleratorConfigError(
                f"torch_tp_plugin={torch_tp_plugin!r}: pass an accel.TorchTensorParallelPlugin."
            )
        warnings.warn(
            "TorchTensorParallelPlugin is deprecated (in Accelerate too); pass "
            "parallelism_config=ParallelismConfig(tp_size=...) instead.",
            FutureWarning,
            stacklevel=4,
        )
        return ParallelismConfig(tp_size=torch_tp_plugin.tp_size)
    return None


def launcher_config(contract: LaunchContract) -> ParallelismConfig | None:
    """The launcher's config: with ``--use_parallelism_config``, one read from the variables.

    ``ACCELERATE_USE_PARALLELISM_CONFIG=true`` counts too; the degrees come from the
    ``PARALLELISM_CONFIG_*`` variables.
    """
    return ParallelismConfig() if contract.use_parallelism_config else None


def check_supported(
    config: ParallelismConfig,
    *,
    distributed_type: DistributedType,
    device: torch.device,
    fsdp_version: int,
) -> None:
    """Refuse, with the reason, what the job's strategy or device cannot run.

    Raises:
        UnsupportedFeatureError: Sequence parallelism; context parallelism or async TP off
            CUDA; a mesh under XLA.
        AcceleratorConfigError: A mesh that DeepSpeed or FSDP1 cannot use, or FSDP with plain
            replicas.
    """
    if config.sp_enabled:
        raise UnsupportedFeatureError(
            SEQUENCE_PARALLEL_REASON.format(size=config.sp_size, backend=config.sp_backend)
        )
    splits = config.tp_enabled or config.cp_enabled or config.shards_parameters
    if distributed_type is DistributedType.XLA and config.total_size > 1:
        raise UnsupportedFeatureError(
            f"ParallelismConfig ({config.describe()}) builds a torch DeviceMesh, which XLA jobs "
            "do not use (torch_xla shards with its own SPMD API); drop parallelism_config."
        )
    if distributed_type is DistributedType.DEEPSPEED and splits:
        raise AcceleratorConfigError(
            f"ParallelismConfig ({config.describe()}) under DeepSpeed: ZeRO shards over every "
            "process and takes no device mesh, so dp_shard/tp/cp cannot compose with it. Use "
            "FSDP2 (--use_fsdp --fsdp_version 2, or fsdp_plugin) for N-D parallelism, or keep "
            "DeepSpeed with dp_shard_size=tp_size=cp_size=1."
        )
    if distributed_type is DistributedType.FSDP and fsdp_version != 2 and splits:
        raise AcceleratorConfigError(
            f"ParallelismConfig ({config.describe()}) needs FSDP2: tensor/context parallelism "
            "and HSDP compose with fully_shard on one device mesh, not with the FSDP1 wrapper. "
            "Set fsdp_version=2 (--fsdp_version 2)."
        )
    if distributed_type is DistributedType.FSDP and config.dp_replicate_enabled and not splits:
        raise AcceleratorConfigError(
            f"ParallelismConfig ({config.describe()}) under FSDP: dp_replicate_size > 1 with "
            "dp_shard_size == 1 is plain replication, which is DDP, not FSDP. Drop the FSDP "
            "setting to train with DDP, or set dp_shard_size > 1 for HSDP."
        )
    if config.cp_enabled:
        from accel.strategies.mesh.context_parallel import check_device

        check_device(device, config.size("cp"))
    handler = config.tp_handler
    async_tp = config.tp_enabled and handler is not None and handler.enable_async_tp
    if async_tp and device.type != "cuda":
        raise UnsupportedFeatureError(
            "TorchTensorParallelConfig(enable_async_tp=True) overlaps the tensor-parallel "
            "collectives with the matmuls through CUDA symmetric memory under torch.compile; "
            f"this job runs on {device.type}. Set enable_async_tp=False."
        )


def _warn_unused_handlers(config: ParallelismConfig, is_main_process: bool) -> None:
    """Accelerate's warning: a handler given for a dimension of size 1 is ignored."""
    unused = [
        f"ParallelismConfig.{dim}_handler is set, but {dim}_size is 1: it is ignored."
        for dim in ("tp", "cp", "sp")
        if getattr(config, f"{dim}_handler") is not None and getattr(config, f"{dim}_size") == 1
    ]
    if unused and is_main_process:
        warnings.warn("\n".join(unused), UserWarning, stacklevel=4)


def build_parallel_mesh(
    config: ParallelismConfig,
    *,
    partial: PartialState,
    distributed_type: DistributedType,
    fsdp_version: int,
) -> ParallelMesh:
    """Fit ``config`` to the job, check it, build its meshes (collective) and activate them.

    A config with every degree 1 in a job of several processes takes them all on
    ``dp_replicate`` (DDP, as in Accelerate) or, under FSDP, on ``dp_shard``.

    Raises:
        accel_state.ParallelismConfigError: The degrees do not fit the number of processes.
        AcceleratorConfigError, UnsupportedFeatureError: See :func:`check_supported`.
    """
    unset = "dp_shard" if distributed_type is DistributedType.FSDP else "dp_replicate"
    config.resolve(partial.num_processes, unset_dimension=unset)
    check_supported(
        config, distributed_type=distributed_type, device=partial.device, fsdp_version=fsdp_version
    )
    _warn_unused_handlers(config, partial.is_main_process)
    config.build_device_mesh(partial.device.type)
    mesh = config.parallel_mesh
    assert mesh is not None, "build_device_mesh always makes the ParallelMesh"
    activate(mesh)
    return mesh


__all__ = [
    "SEQUENCE_PARALLEL_REASON",
    "TorchTensorParallelPlugin",
    "build_parallel_mesh",
    "check_supported",
    "launcher_config",
    "requested_config",
]
