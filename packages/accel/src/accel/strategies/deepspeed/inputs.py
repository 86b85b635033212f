"""Float inputs of a bf16 DeepSpeed engine: cast to bf16 before the model sees them.

With ``bf16.enabled`` DeepSpeed stores the model's weights in bf16 but passes inputs through as
given, so a float32 batch meets bf16 weights and torch raises "mat1 and mat2 must have the same
dtype". DeepSpeed's ``fp16.auto_cast`` casts inputs for fp16 only; accel does the same for bf16,
so a script that runs under ``--mixed_precision bf16`` elsewhere runs under DeepSpeed unchanged.
Inputs already in bf16, integer inputs (token ids) and engines that use torch autocast
(``torch_autocast.enabled``: fp32 weights) are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from accel_ops import recursively_apply

_WIDER_FLOATS = (torch.float32, torch.float64, torch.float16)


def _leaf_to_bf16(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.bfloat16) if tensor.dtype in _WIDER_FLOATS else tensor


def to_bf16(value: Any) -> Any:
    """``value`` with every float32/float64/float16 tensor inside it cast to bf16."""
    return recursively_apply(_leaf_to_bf16, value)


def _cast_hook(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return to_bf16(args), to_bf16(kwargs)


def cast_inputs_for_bf16(engine: Any, config: Mapping[str, Any]) -> bool:
    """Make ``engine``'s model take float inputs under a bf16 config; whether a hook was added."""
    bf16 = config.get("bf16") or config.get("bfloat16") or {}
    autocast = config.get("torch_autocast") or {}
    if not bf16.get("enabled") or autocast.get("enabled"):
        return False
    engine.module.register_forward_pre_hook(_cast_hook, with_kwargs=True)
    return True
