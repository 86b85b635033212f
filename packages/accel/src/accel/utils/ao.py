"""Accelerate's ``accelerate.utils.ao`` module path: fp8 training through torchao."""

from __future__ import annotations

from accel.fp8.ao import (
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)

__all__ = [
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]
