"""``LocalSGD``: train without per-step gradient synchronisation, average parameters every N steps."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel_state import DistributedType

if TYPE_CHECKING:
    from accel.accelerator import Accelerator

_SUPPORTED = (
    DistributedType.NO,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_HPU,
)


class LocalSGD:
    """Local SGD: step on local gradients, average parameters every ``local_sgd_steps`` steps.

    Processes skip the gradient all-reduce inside the block and average their parameters every
    ``local_sgd_steps`` optimizer steps and when the block ends.

    Example:
        >>> with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:
        ...     for batch in dataloader:
        ...         ...
        ...         optimizer.step()
        ...         local_sgd.step()

    Args:
        accelerator: The Accelerator that prepared ``model``.
        model: The prepared model.
        local_sgd_steps: Optimizer steps between parameter averages (>= 1).
        enabled: False turns it into a no-op (plain synchronous training).

    Raises:
        UnsupportedFeatureError: Enabled in a job that is not single-process or DDP (FSDP,
            DeepSpeed, Megatron-LM, XLA); ``enabled=False`` is accepted there.
        AcceleratorConfigError: ``local_sgd_steps`` is below 1.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ) -> None:
        if enabled and accelerator.distributed_type not in _SUPPORTED:
            raise UnsupportedFeatureError(
                f"LocalSGD supports single-process and DDP jobs, not distributed_type="
                f"{accelerator.distributed_type.value}; pass enabled=False or use plain DDP."
            )
        if local_sgd_steps < 1:
            raise AcceleratorConfigError(
                f"LocalSGD(local_sgd_steps={local_sgd_steps}): must be >= 1."
            )
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync = contextlib.ExitStack()

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self.enabled and exc_type is None:
                self._sync_and_avg_model_params()
        finally:
            self._no_sync.close()

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps``."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        """Replace every parameter by its mean across processes."""
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast(), torch.no_grad():
            for parameter in self.model.parameters():
                parameter.data = self.accelerator.reduce(parameter.data, reduction="mean")
