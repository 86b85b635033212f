"""The Accelerator's training step: backward, accumulation, no-sync, autocast, clipping."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from accel.fault_tolerance import FaultTolerance
from accel.job_facts import JobFactsMixin
from accel.kwargs_handlers import AutocastKwargs
from accel.optimizer import AcceleratedOptimizer
from accel.uneven_inputs import join_uneven_inputs, trigger_sync_in_backward


class TrainingStepMixin(JobFactsMixin):
    """What a training loop calls every step (Accelerate's names and semantics).

    The host class provides the attributes declared here and in :class:`JobFactsMixin`.
    """

    step: int
    fault_tolerance: FaultTolerance
    autocast_handler: AutocastKwargs | None
    _dataloaders: list[Any]

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Use instead of ``loss.backward()``: divides by the accumulation steps, scales under fp16."""
        steps = self.gradient_accumulation_steps
        if steps != 1 and not self.strategy.engine_owns_gradients:  # no extra node when 1
            loss = loss / steps
        with self.fault_tolerance.backward(loss):
            self.strategy.backward(self.precision.scale_loss(loss), **kwargs)

    def _do_sync(self) -> None:
        if self.gradient_state.sync_with_dataloader and self.gradient_state.end_of_dataloader:
            self.step = 0
            self.gradient_state.set_sync_gradients(True)
        else:
            self.step += 1
            self.gradient_state.set_sync_gradients(self.step % self.gradient_state.num_steps == 0)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Context for one micro-step: synchronise and step only every N-th time or at the end.

        Inside it, prepared optimizers step (and zero their gradients) only on synchronisation
        steps, and DDP skips its all-reduce on the other micro-steps.
        """
        self._do_sync()
        allow_sync = self.sync_gradients or (
            self.use_distributed and self.gradient_state.sync_each_batch
        )
        with contextlib.ExitStack() as stack:
            if not allow_sync:
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context manager in which backward passes of ``model`` do not synchronise gradients."""
        return self.strategy.no_sync(model)

    def autocast(
        self, autocast_handler: AutocastKwargs | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Run the block in the Accelerator's mixed precision (e.g. a loss outside the model)."""
        return self.precision.autocast(autocast_handler or self.autocast_handler)

    def unscale_gradients(
        self, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None
    ) -> None:
        """Divide gradients by the fp16 loss scale (once per step; a no-op in other precisions)."""
        if optimizer is None:
            optimizers: Sequence[torch.optim.Optimizer] = self._optimizers
        elif isinstance(optimizer, torch.optim.Optimizer):
            optimizers = [optimizer]
        else:
            optimizers = optimizer
        for opt in optimizers:
            self.precision.unscale_(opt.optimizer if isinstance(opt, AcceleratedOptimizer) else opt)

    def _gradient_scale(self) -> float:
        """Factor the gradients carry now: 1 once unscaled, the fp16 loss scale otherwise.

        On a synchronising step the gradients are completed (XLA) and unscaled here, once per
        step. On an accumulation micro-step they stay scaled: unscaling a partial gradient would
        mix unscaled and scaled values when the next micro-step adds to it.
        """
        if not self.sync_gradients:
            return self.precision.gradient_scale()
        for optimizer in self._optimizers:
            self.strategy.before_clipping(optimizer.optimizer)
        self.unscale_gradients()
        return 1.0

    def clip_grad_norm_(
        self, parameters: Any, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradient norm of ``parameters`` to ``max_norm``; returns the norm before.

        Clips on every call, as Accelerate does. On a synchronising step that is the full
        gradient (unscaled first under fp16); on an accumulation micro-step it is the gradient
        accumulated so far on this process (under fp16 the norm is computed and clipped on the
        still-scaled gradient, and returned unscaled).
        """
        tensors = self.strategy.resolve_parameters(_parameter_list(parameters))
        if self.strategy.engine_owns_gradients:
            return self.strategy.clip_grad_norm_(tensors, max_norm, norm_type=norm_type)
        scale = self._gradient_scale()
        norm = self.strategy.clip_grad_norm_(tensors, max_norm * scale, norm_type=norm_type)
        return norm if scale == 1.0 else norm / scale

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clamp every gradient of ``parameters`` to ``[-clip_value, clip_value]``, on every call.

        Gradients are unscaled first on synchronising steps under fp16; on micro-steps the
        bound is applied to the still-scaled gradient (``clip_value`` times the loss scale).
        """
        tensors = self.strategy.resolve_parameters(_parameter_list(parameters))
        if self.strategy.engine_owns_gradients:
            self.strategy.clip_grad_value_(tensors, clip_value)
            return
        self.strategy.clip_grad_value_(tensors, clip_value * self._gradient_scale())

    def join_uneven_inputs(
        self, joinables: Sequence[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Train on uneven inputs: processes out of batches shadow the others' collectives.

        Args:
            joinables: Prepared DDP models (and other ``Joinable`` objects, e.g. a
                ``ZeroRedundancyOptimizer``) used inside the block.
            even_batches: Override the prepared dataloaders' ``even_batches`` inside the block.
        """
        return self._joined(joinables, even_batches)

    @contextlib.contextmanager
    def _joined(self, joinables: Sequence[Any], even_batches: bool | None) -> Iterator[None]:
        """Join, with the slow-rank report paused (processes leave the loop at different steps)."""
        with (
            self.fault_tolerance.slow_ranks_paused(),
            join_uneven_inputs(
                self.distributed_type, self._dataloaders, joinables, even_batches, self.even_batches
            ),
        ):
            yield

    def trigger_sync_in_backward(
        self, model: torch.nn.Module
    ) -> contextlib.AbstractContextManager[None]:
        """Force the next backward pass of ``model`` to synchronise gradients (even in ``no_sync``)."""
        return trigger_sync_in_backward(model, self.use_distributed)


def _parameter_list(parameters: Any) -> list[torch.Tensor]:
    """``parameters`` (a tensor or an iterable of tensors, possibly a generator) as a list."""
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    return list(parameters)
