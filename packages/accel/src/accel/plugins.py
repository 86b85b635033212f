"""Plugins: bundles of settings for gradient accumulation and model-sharding strategies."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from accel.errors import AcceleratorConfigError


@dataclasses.dataclass
class GradientAccumulationPlugin:
    """How gradient accumulation behaves.

    Args:
        num_steps: Micro-steps per optimizer step.
        adjust_scheduler: Count skipped micro-steps in the scheduler's step counter.
        sync_with_dataloader: Force a sync (and optimizer step) at the end of each dataloader.
        sync_each_batch: Synchronise gradients on every micro-step (less memory, more traffic).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise AcceleratorConfigError(
                f"GradientAccumulationPlugin(num_steps={self.num_steps!r}): must be an integer >= 1."
            )

    def to_kwargs(self) -> dict[str, Any]:
        """All fields as a dictionary (what ``GradientState`` takes)."""
        return dataclasses.asdict(self)

    def to_dict(self) -> dict[str, Any]:
        """A copy of every field, as Accelerate's ``KwargsHandler.to_dict``."""
        return copy.deepcopy(dict(vars(self)))
