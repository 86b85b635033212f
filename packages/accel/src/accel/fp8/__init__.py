"""fp8 mixed precision: recipes, one precision object per backend, and the torchao converter.

Backends: torchao (``AO``: ``Float8Linear`` layers, runs on fp8 GPUs and on the CPU),
TransformerEngine (``TE``) and MS-AMP (``MSAMP``), both on CUDA GPUs with compute capability
8.9+. Importing this package imports none of them; each is imported when a job uses it.
"""

from accel.fp8.ao import (
    AOPrecision,
    Float8Converter,
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)
from accel.fp8.capability import check_cuda_fp8_capability
from accel.fp8.recipes import (
    AORecipeKwargs,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)
from accel.fp8.setup import FP8AttributesMixin, FP8Setup, make_fp8_precision, resolve_fp8
from accel.fp8.transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
)

__all__ = [
    "AOPrecision",
    "AORecipeKwargs",
    "FP8AttributesMixin",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "FP8Setup",
    "Float8Converter",
    "MSAMPRecipeKwargs",
    "TERecipeKwargs",
    "apply_fp8_autowrap",
    "check_cuda_fp8_capability",
    "contextual_fp8_autocast",
    "convert_model",
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
    "has_transformer_engine_layers",
    "make_fp8_precision",
    "resolve_fp8",
]
