"""``AcceleratedScheduler``: a learning-rate scheduler that follows the real optimizer steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accel.optimizer import AcceleratedOptimizer
from accel_state import GradientState


class AcceleratedScheduler:
    """Steps the wrapped scheduler only when its optimizers really stepped.

    With ``step_with_optimizer`` (the default) a call on a micro-step that accumulates gradients
    does not move the schedule (its step counter still advances when ``adjust_scheduler``), a
    step skipped by the fp16 scaler does not move it either, and when batches are multiplied
    across processes (``split_batches=False``) each real step advances the schedule
    ``num_processes`` times, so a schedule written for one process ends at the right point.

    Args:
        scheduler: The scheduler to wrap.
        optimizers: The prepared optimizers it follows.
        step_with_optimizer: Follow the optimizers as above; False steps on every call.
        split_batches: Whether batches are split (not multiplied) across processes.
        num_processes: Number of processes in the job.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: Sequence[AcceleratedOptimizer],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_processes: int = 1,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = list(optimizers)
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule as described on the class."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return
        repeats = 1 if self.split_batches else self.num_processes
        total_steps = getattr(self.scheduler, "total_steps", None)
        for _ in range(repeats):
            if total_steps is not None and self.scheduler._step_count > total_steps:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The learning rates after the last step."""
        return self.scheduler.get_last_lr()  # type: ignore[no-any-return]

    def get_lr(self) -> list[float]:
        """The learning rates the schedule computes now."""
        return self.scheduler.get_lr()  # type: ignore[no-any-return]

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state dict."""
        return self.scheduler.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped scheduler."""
        self.scheduler.load_state_dict(state_dict)

    def print_lr(self, *args: Any, **kwargs: Any) -> None:
        """Forward to the wrapped scheduler."""
        self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
