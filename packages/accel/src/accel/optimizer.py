"""``AcceleratedOptimizer``: an optimizer that steps only on synchronisation steps."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import torch

from accel.precision import Precision
from accel.strategies.base import ModelStrategy
from accel_ops import send_to_device
from accel_state import GradientState


def move_to_device(state: Any, device: torch.device | str | int) -> Any:
    """Move every tensor of ``state`` (nested lists, tuples, dicts) to ``device``.

    Accelerate's helper for optimizer state; other leaves are returned as they are.
    """
    return send_to_device(state, device)


def patch_optimizer_step(
    accelerated_optimizer: AcceleratedOptimizer, method: Callable[..., Any]
) -> Callable[..., Any]:
    """``method`` wrapped to record on ``accelerated_optimizer`` that it was called.

    A grad scaler skips the optimizer's ``step`` when gradients hold inf/nan; the wrapper sets
    ``accelerated_optimizer._accelerate_step_called = True`` when the step really runs, so the
    caller can tell a skipped step (:attr:`AcceleratedOptimizer.step_was_skipped`).
    """

    @functools.wraps(method)
    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step


class StepObserver(Protocol):
    """Told when each real optimizer step starts and ends (accel's slow-rank report)."""

    def step_started(self) -> None:
        """The step begins."""

    def step_finished(self) -> None:
        """The step ended."""


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer for gradient accumulation, loss scaling and distributed strategies.

    ``step`` and ``zero_grad`` do nothing on micro-steps that do not synchronise gradients;
    under fp16 the step goes through the grad scaler and :attr:`step_was_skipped` tells whether
    inf/nan gradients made it skip.

    Args:
        optimizer: The optimizer to wrap.
        device_placement: Move existing optimizer state to the device of its parameters.
        scaler: A ``torch.amp.GradScaler`` to step through (Accelerate's way of passing loss
            scaling), for an optimizer wrapped without the Accelerator's ``precision``; ignored
            when ``precision`` is given (the Accelerator's own scaler is used).
        precision: The precision object (grad scaler) of the Accelerator.
        strategy: The model strategy (hooks before each real step).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Any = None,
        precision: Precision | None = None,
        strategy: ModelStrategy | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.scaler: Any = scaler if precision is None else None
        self._accelerate_step_called = False
        self.precision = precision
        self.strategy = strategy
        self.gradient_state = GradientState()
        self._step_was_skipped = False
        #: Set under fault tolerance: averages the gradients across replica groups and says
        #: whether the step is committed (else the optimizer does not step).
        self.commit_gate: Callable[[torch.optim.Optimizer], bool] | None = None
        #: Told when each real step starts and ends (the slow-rank report's optimizer clock).
        self.step_observer: StepObserver | None = None
        if device_placement and optimizer.state:
            self._move_state_to_parameter_devices()

    def _move_state_to_parameter_devices(self) -> None:
        for group in self.optimizer.param_groups:
            for parameter in group["params"]:
                if parameter in self.optimizer.state:
                    self.optimizer.state[parameter] = send_to_device(
                        self.optimizer.state[parameter], parameter.device
                    )

    # Delegated attributes --------------------------------------------------------------------
    @property
    def state(self) -> Any:  # type: ignore[override]
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's default hyper-parameters."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer, then move its state next to the parameters."""
        self.optimizer.load_state_dict(state_dict)
        self._move_state_to_parameter_devices()

    # Training ----------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients, except on micro-steps that accumulate them."""
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """Step on synchronisation steps only (through the grad scaler under fp16)."""
        if not self.gradient_state.sync_gradients:
            return
        if self.commit_gate is not None and not self.commit_gate(self.optimizer):
            self._step_was_skipped = True
            return
        observer = self.step_observer
        if observer is not None:
            observer.step_started()
        try:
            self._step(closure)
        finally:
            if observer is not None:
                observer.step_finished()

    def _step(self, closure: Callable[[], float] | None) -> None:
        """The real step: the strategy's hooks around the optimizer's (or the scaler's) step."""
        if self.strategy is not None:
            self.strategy.before_optimizer_step(self.optimizer)
        kwargs = {} if closure is None else {"closure": closure}
        if self.precision is None and self.scaler is not None:
            self._step_was_skipped = self._scaler_step(closure)
        elif self.precision is None:
            self.optimizer.step(**kwargs)
            self._step_was_skipped = False
        else:
            self._step_was_skipped = self.precision.step(self.optimizer, **kwargs)
        if self.strategy is not None:
            self.strategy.after_optimizer_step(self.optimizer)

    def _scaler_step(self, closure: Callable[[], float] | None) -> bool:
        """Step through ``self.scaler``; whether the scaler skipped the optimizer's step."""
        original = self.optimizer.step
        self._accelerate_step_called = False
        self.optimizer.step = patch_optimizer_step(self, original)  # type: ignore[method-assign]
        try:
            self.scaler.step(self.optimizer, closure)
            self.scaler.update()
        finally:
            self.optimizer.step = original  # type: ignore[method-assign]
        skipped = not self._accelerate_step_called
        self._accelerate_step_called = False
        return skipped

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last real step was skipped because of inf/nan gradients (fp16)."""
        return self._step_was_skipped

    @property
    def _is_overflow(self) -> bool:
        """Accelerate's private name for :attr:`step_was_skipped` (tests and libraries set it)."""
        return self._step_was_skipped

    @_is_overflow.setter
    def _is_overflow(self, value: bool) -> None:
        self._step_was_skipped = bool(value)

    @property
    def is_overflow(self) -> bool:
        """Alias of :attr:`step_was_skipped`."""
        return self._step_was_skipped

    def train(self) -> None:
        """Forward ``train()`` to optimizers that have one (schedule-free optimizers)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        """Forward ``eval()`` to optimizers that have one (schedule-free optimizers)."""
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["step_observer"] = None  # belongs to this process's Accelerator
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
