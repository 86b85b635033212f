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


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (inside DDP / compile wrappers) is a PEFT ``PeftModel``.

    ``False`` when peft is not installed (it is never imported otherwise).
    """
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(extract_model_from_parallel(model), PeftModel)
