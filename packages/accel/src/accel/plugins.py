"""Plugins: bundles of settings for gradient accumulation and model-sharding strategies."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from accel.errors import AcceleratorConfigError
from accel.kwargs_handlers import KwargsHandler


@dataclasses.dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves.

    As in Accelerate, :meth:`to_kwargs` returns only the fields changed from these defaults, and
    ``GradientState`` keeps that dictionary as ``plugin_kwargs``: a field left at its default is
    absent there and ``GradientState`` falls back on its own default (``num_steps`` 1,
    ``adjust_scheduler`` False, ``sync_with_dataloader`` True, ``sync_each_batch`` False).

    Args:
        num_steps: Micro-steps per optimizer step (``None``: not set, which means 1).
        adjust_scheduler: Count skipped micro-steps in the scheduler's step counter. As in
            Accelerate, True is the default and so never reaches ``plugin_kwargs``:
            ``GradientState.adjust_scheduler`` reads False unless that dict is written directly.
        sync_with_dataloader: Force a sync (and optimizer step) at the end of each dataloader.
        sync_each_batch: Synchronise gradients on every micro-step (less memory, more traffic).
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is not None and (
            not isinstance(self.num_steps, int) or self.num_steps < 1
        ):
            raise AcceleratorConfigError(
                f"GradientAccumulationPlugin(num_steps={self.num_steps!r}): must be an integer "
                ">= 1 (or None for 1)."
            )

    def to_dict(self) -> dict[str, Any]:
        """A copy of every field, as Accelerate's ``KwargsHandler.to_dict``."""
        return copy.deepcopy(dict(vars(self)))
