"""Model-wrapping strategies, chosen by distributed type from a registry (not an if-chain).

A later strategy (DeepSpeed, FSDP) registers itself with :func:`register_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accel.errors import UnsupportedFeatureError
from accel.run_config import RunConfig
from accel.strategies.base import ModelStrategy
from accel.strategies.ddp.strategy import DDPStrategy
from accel.strategies.fsdp.strategy import FSDPStrategy
from accel.strategies.xla.strategy import XLAStrategy
from accel_state import DistributedType

StrategyFactory = Callable[[RunConfig], ModelStrategy]


def _deepspeed(config: RunConfig) -> ModelStrategy:
    """Import the DeepSpeed strategy only when a job uses it."""
    from accel.strategies.deepspeed.strategy import DeepSpeedStrategy

    return DeepSpeedStrategy(config)


_STRATEGIES: dict[DistributedType, StrategyFactory] = {
    DistributedType.NO: ModelStrategy,
    DistributedType.MULTI_CPU: DDPStrategy,
    DistributedType.MULTI_GPU: DDPStrategy,
    DistributedType.MULTI_XPU: DDPStrategy,
    DistributedType.XLA: XLAStrategy,
    DistributedType.DEEPSPEED: _deepspeed,
    DistributedType.FSDP: FSDPStrategy,
}


def register_strategy(distributed_type: DistributedType, factory: StrategyFactory) -> None:
    """Make ``factory(config)`` (a :class:`~accel.run_config.RunConfig`) the strategy for the type."""
    _STRATEGIES[distributed_type] = factory


def make_strategy(config: RunConfig) -> ModelStrategy:
    """Build the strategy for the run's distributed type, or the N-D one for a mesh that splits models.

    Args:
        config: The run configuration. When its ``parallel_mesh`` shards or splits models
            (``dp_shard``, ``tp``, ``cp`` above 1) :class:`MeshStrategy` prepares them, composing
            TP/CP with FSDP2 on it. A mesh of ``dp_replicate`` only keeps the type's strategy.

    Raises:
        UnsupportedFeatureError: No strategy is registered for that type yet.
    """
    if config.parallel_mesh is not None:  # the mesh modules load DTensor: only for meshes
        from accel.strategies.mesh.strategy import MeshStrategy, needs_mesh_strategy

        if needs_mesh_strategy(config.parallel_mesh):
            return MeshStrategy(config)
    factory = _STRATEGIES.get(config.distributed_type)
    if factory is None:
        raise UnsupportedFeatureError(
            f"distributed_type={config.distributed_type.value} has no model strategy in this "
            f"version of accel (available: {', '.join(sorted(t.value for t in _STRATEGIES))})."
        )
    return factory(config)


__all__ = [
    "DDPStrategy",
    "FSDPStrategy",
    "ModelStrategy",
    "XLAStrategy",
    "make_strategy",
    "register_strategy",
]
