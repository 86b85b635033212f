"""Accelerate's ``accelerate.utils.bnb`` module path: 8-bit and 4-bit models (accel-ckpt)."""

from __future__ import annotations

from accel_ckpt.big_modeling.quantization import (
    BnbQuantizationConfig,
    get_keys_to_not_convert,
    get_parameter_device,
    get_quantized_model_device_map,
    has_4bit_bnb_layers,
    load_and_quantize_model,
    replace_with_bnb_layers,
)

__all__ = [
    "BnbQuantizationConfig",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "get_quantized_model_device_map",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
    "replace_with_bnb_layers",
]
