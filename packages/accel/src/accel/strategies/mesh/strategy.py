"""N-D parallelism on one ``DeviceMesh``: tensor and context parallelism composed with FSDP2/HSDP.

A model is prepared in torchtitan's order, each step on the mesh of a
:class:`~accel_state.ParallelismConfig`:

1. low-precision conversion: the Accelerator's precision object (fp8: torchao's ``Float8Linear``)
   converts the model in ``prepare_model`` just before :meth:`MeshStrategy.wrap`, so tensor
   parallelism splits the converted layers,
2. tensor parallelism on ``tp`` (:class:`~accel.strategies.mesh.tensor_parallel.TensorParallel`),
3. context parallelism on ``cp`` (nothing to change in the module: batches are split per step by
   ``Accelerator.maybe_context_parallel``; only the device is checked),
4. activation checkpointing of the FSDP layers,
5. ``torch.compile`` of the repeated blocks (regional compilation: after checkpointing, before
   sharding; a whole-model compile comes after sharding, from the Accelerator),
6. FSDP2 ``fully_shard`` over ``dp_shard_cp`` (HSDP: ``dp_replicate x dp_shard_cp``), inner
   layers first, then the root.

Everything after ``prepare`` is FSDP2's (no-sync micro-steps, sharded checkpoints through DCP,
full state dicts), extended to models whose parameters are DTensors without FSDP (``tp`` only),
and gradient clipping takes the norm over every mesh dimension.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from accel.compilation import compile_model
from accel.errors import AcceleratorConfigError
from accel.kwargs_handlers import TorchDynamoPlugin
from accel.run_config import RunConfig
from accel.strategies import grad_norm
from accel.strategies.fsdp.strategy import (
    FSDPStrategy,
    broadcast_from_rank0,
    checkpoint_activations,
    clean_name,
)
from accel.strategies.mesh.tensor_parallel import TensorParallel, is_split
from accel.torch_compat import require_torch_feature
from accel_state.device_mesh import ParallelMesh


class MeshStrategy(FSDPStrategy):
    """Prepares models on a :class:`~accel_state.device_mesh.ParallelMesh` (TP, CP, FSDP2, HSDP).

    Args:
        config: The run configuration; its ``parallel_mesh`` (the ``ParallelismConfig``'s meshes,
            resolved and built) must be set.

    Raises:
        accel.UnsupportedFeatureError: Context parallelism on a device torch cannot run it on.
        AcceleratorConfigError: FSDP settings that do not apply (see ``FSDPStrategy``).
    """

    name = "N-D parallel (DeviceMesh)"

    def __init__(self, run: RunConfig) -> None:
        if run.parallel_mesh is None:
            raise AcceleratorConfigError(
                "MeshStrategy needs RunConfig.parallel_mesh (a ParallelismConfig's meshes); "
                "pass parallelism_config=ParallelismConfig(...) to the Accelerator."
            )
        require_torch_feature("device_mesh", run.device.type)
        super().__init__(run)
        parallel_mesh = run.parallel_mesh
        config = parallel_mesh.config
        self.parallel_mesh = parallel_mesh
        self.tensor_parallel: TensorParallel | None = None
        if config.tp_enabled:
            require_torch_feature("tensor_parallel", run.device.type)
            handler = config.tp_handler
            plan = None if handler is None else handler.plan
            self.tensor_parallel = TensorParallel(parallel_mesh.get_mesh("tp"), plan)
            if handler is not None and handler.enable_async_tp:  # CUDA (checked at init)
                _enable_async_tp(parallel_mesh.get_mesh("tp"))
        if config.cp_enabled:
            from accel.strategies.mesh.context_parallel import check_device

            require_torch_feature("context_parallel")
            check_device(run.device, config.size("cp"))
        if config.shards_parameters:
            self.mesh = parallel_mesh.fsdp_mesh()

    # ------------------------------------------------------------------ preparing a model
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Split and shard ``model`` (already on its device) in the module docstring's order."""
        if self._is_fsdp(model) or not any(p.requires_grad for p in model.parameters()):
            return model
        before = {clean_name(name): parameter for name, parameter in model.named_parameters()}
        if self.fsdp.sync_module_states and not is_split(model):
            broadcast_from_rank0(model)
        if self.tensor_parallel is not None:
            self.tensor_parallel.apply(model)
        layers = self._layers(model)
        if self.fsdp.activation_checkpointing:
            checkpoint_activations(model, layers)
        plugin = self.config.dynamo_plugin
        if plugin is not None and plugin.enabled and plugin.use_regional_compilation:
            compile_model(model, plugin)
        if self.mesh is not None:
            model = self._fully_shard(model, layers)
        self._adopt(model, before)
        return model

    def track_unwrapped(self, model: torch.nn.Module) -> None:
        """Track a model its library already split on the mesh (prepared with evaluation_mode).

        transformers' Trainer prepares a ``from_pretrained(tp_plan=...)`` model that way and
        syncs its replicated parameters itself; its optimizer, clipping and checkpoints still go
        through this strategy, so the model counts as one of its own.
        """
        if is_split(model):
            self._adopt(model, {clean_name(name): p for name, p in model.named_parameters()})

    def compile(self, model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
        """Whole-model compilation after sharding; regional compilation already ran in :meth:`wrap`."""
        if plugin.enabled and plugin.use_regional_compilation:
            return model
        return compile_model(model, plugin)

    def _is_fsdp(self, model: torch.nn.Module) -> bool:
        return super()._is_sharded(model)

    def _is_sharded(self, model: torch.nn.Module) -> bool:
        """FSDP models and models split on the mesh: both checkpoint through DCP."""
        return self._is_fsdp(model) or is_split(model)

    # ------------------------------------------------------------------ training step
    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm over every mesh dimension; returns that norm (a plain tensor)."""
        return grad_norm.clip_grad_norm(parameters, max_norm, norm_type)


def _enable_async_tp(tp_mesh: Any) -> None:
    """Enable async TP: compiled matmuls overlap the ``tp`` collectives (symmetric memory)."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def needs_mesh_strategy(parallel_mesh: ParallelMesh | None) -> bool:
    """Whether a job's mesh splits or shards models (anything beyond plain DDP replicas)."""
    if parallel_mesh is None:
        return False
    config = parallel_mesh.config
    return config.tp_enabled or config.cp_enabled or config.sp_enabled or config.shards_parameters


__all__: Sequence[str] = ["MeshStrategy", "needs_mesh_strategy"]
