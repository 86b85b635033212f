"""``DistributedDataParallel`` for multi-process CPU (gloo) and GPU (NCCL) jobs."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from accel.strategies.base import ModelStrategy


class DDPStrategy(ModelStrategy):
    """Wraps trainable models in DDP, which broadcasts rank 0's weights at construction.

    Settings are ``DistributedDataParallelKwargs`` fields.
    """

    name = "DistributedDataParallel"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``model`` in DDP unless it has nothing to train or is already wrapped."""
        if isinstance(model, DistributedDataParallel):
            return model
        if not any(parameter.requires_grad for parameter in model.parameters()):
            return model
        device = self.state.device
        device_ids = [device.index] if device.type in ("cuda", "xpu") else None
        return DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=device_ids[0] if device_ids else None,
            **self.settings,
        )

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The module inside a DDP wrapper."""
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            return model.module  # type: ignore[no-any-return]
        return None

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """DDP's own ``no_sync`` for wrapped models."""
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()
