"""Model-wrapping strategies, chosen by distributed type from a registry (not an if-chain).

A later strategy (DeepSpeed, FSDP) registers itself with :func:`register_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accel.errors import UnsupportedFeatureError
from accel.strategies.base import ModelStrategy
from accel.strategies.ddp import DDPStrategy
from accel.strategies.fsdp import FSDPStrategy
from accel.strategies.xla import XLAStrategy
from accel_state import DistributedType, PartialState
from accel_state.device_mesh import ParallelMesh

StrategyFactory = Callable[..., ModelStrategy]


def _deepspeed(state: PartialState, **settings: Any) -> ModelStrategy:
    """Import the DeepSpeed strategy only when a job uses it."""
    from accel.strategies.deepspeed import DeepSpeedStrategy

    return DeepSpeedStrategy(state, **settings)


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
    """Make ``factory(state, **settings)`` the strategy for ``distributed_type``."""
    _STRATEGIES[distributed_type] = factory


def make_strategy(
    distributed_type: DistributedType,
    state: PartialState,
    parallel_mesh: ParallelMesh | None = None,
    **settings: Any,
) -> ModelStrategy:
    """Build the strategy for ``distributed_type``, or the N-D one for a mesh that splits models.

    Args:
        distributed_type: The job's distributed mode.
        state: The job's state.
        parallel_mesh: The job's ``ParallelismConfig`` mesh; when it shards or splits models
            (``dp_shard``, ``tp``, ``cp`` above 1) :class:`MeshStrategy` prepares them, composing
            TP/CP with FSDP2 on it. A mesh of ``dp_replicate`` only keeps the type's strategy.
        **settings: The strategy's own settings (``DistributedDataParallelKwargs`` fields).

    Raises:
        UnsupportedFeatureError: No strategy is registered for that type yet.
    """
    from accel.strategies.mesh import MeshStrategy, needs_mesh_strategy

    if needs_mesh_strategy(parallel_mesh):
        assert parallel_mesh is not None
        return MeshStrategy(state, parallel_mesh=parallel_mesh)
    factory = _STRATEGIES.get(distributed_type)
    if factory is None:
        raise UnsupportedFeatureError(
            f"distributed_type={distributed_type.value} has no model strategy in this version of accel "
            f"(available: {', '.join(sorted(t.value for t in _STRATEGIES))})."
        )
    return factory(state, **settings)


__all__ = [
    "DDPStrategy",
    "FSDPStrategy",
    "ModelStrategy",
    "XLAStrategy",
    "make_strategy",
    "register_strategy",
]
