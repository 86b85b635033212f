"""Model helpers exposed under ``accel.utils``."""

from __future__ import annotations

import torch

from accel.modeling import unwrap_model


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True
) -> torch.nn.Module:
    """The user's model inside DDP / DataParallel / ``torch.compile`` wrappers."""
    return unwrap_model(model, keep_fp32_wrapper=keep_fp32_wrapper)
