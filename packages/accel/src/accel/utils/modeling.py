"""Model helpers exposed under ``accel.utils``."""

from __future__ import annotations

import torch

from accel.modeling import unwrap_model


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The user's model inside DDP / DataParallel (and, unless kept, ``torch.compile``) wrappers.

    Args:
        model: The model to extract.
        keep_fp32_wrapper: Keep the mixed-precision forward patch.
        keep_torch_compile: Return it still compiled when it was (Accelerate's default).
        recursive: Also unwrap wrapped sub-modules, in place.
    """
    return unwrap_model(
        model,
        keep_fp32_wrapper=keep_fp32_wrapper,
        keep_torch_compile=keep_torch_compile,
        recursive=recursive,
    )
