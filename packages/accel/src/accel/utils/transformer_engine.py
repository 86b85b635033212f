"""Accelerate's ``accelerate.utils.transformer_engine`` module path (fp8 on fp8-capable GPUs)."""

from __future__ import annotations

from accel.fp8.transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
]
