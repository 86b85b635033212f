"""XLA devices (TPU, XLA on CPU/GPU): gradients reduced before each step, graph cut after it."""

from __future__ import annotations

import torch

from accel.run_config import RunConfig
from accel.strategies.base import ModelStrategy
from accel_ops import xla as xla_ops


class XLAStrategy(ModelStrategy):
    """No wrapper; the master weights are broadcast once and gradients reduced before each step.

    After every real optimizer step the traced graph is cut and run (``torch_xla.sync``), as
    ``xm.optimizer_step(barrier=True)`` does: each step then compiles to the same graph (cached
    after the first), and a loop that does not use the prepared dataloader (whose device loader
    also cuts the graph at each batch) does not trace the whole epoch into one graph.
    """

    name = "XLA"

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self._already_reduced: set[int] = set()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Broadcast rank 0's parameters so every replica starts equal."""
        if self.state.use_distributed:
            xla_ops.xla_model().broadcast_master_param(model)
        return model

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """All-reduce (average) the gradients across replicas, unless clipping already did."""
        if id(optimizer) in self._already_reduced:
            self._already_reduced.discard(id(optimizer))
            return
        self._reduce(optimizer)

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Cut the graph after the step, so the updated weights are computed once per step."""
        xla_ops.sync()

    def before_clipping(self, optimizer: torch.optim.Optimizer) -> None:
        """Reduce before clipping so the norm is the global one; the step then skips it."""
        if id(optimizer) not in self._already_reduced:
            self._reduce(optimizer)
            self._already_reduced.add(id(optimizer))

    def _reduce(self, optimizer: torch.optim.Optimizer) -> None:
        if self.state.use_distributed:
            xla_ops.xla_model().reduce_gradients(optimizer)
