"""fp8 training through NVIDIA TransformerEngine (the ``TE`` backend), on fp8-capable GPUs.

At ``prepare`` the model's ``nn.Linear`` (dimensions divisible by 16) and ``nn.LayerNorm``
layers become TransformerEngine's, with the same weights, and the forward runs under
``transformer_engine.pytorch.fp8_autocast`` with the recipe's scaling settings (in training
mode, and in evaluation too with ``use_autocast_during_eval``). The precision object refuses the
job up front when TransformerEngine is not installed or the GPU has no fp8 tensor cores.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from accel.errors import UnsupportedFeatureError
from accel.fp8.capability import fp8_device_problem, require_package
from accel.fp8.recipes import FP8RecipeKwargs, TERecipeKwargs
from accel.placement import ParameterMoves
from accel.precision import BF16Precision
from accel_state import PrecisionType

TE_INSTALL = (
    "pip install transformer-engine[pytorch] on a machine with CUDA (it builds against the "
    "local CUDA toolkit)"
)
_FP8_DIM_MULTIPLE = 16


def _require_te() -> str:
    return require_package(
        "transformer_engine", "transformer-engine", "TransformerEngine (TE)", TE_INSTALL
    )


def has_transformer_engine_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds TransformerEngine ``Linear`` or ``LayerNorm`` layers."""
    return any(
        type(module).__module__.startswith("transformer_engine.pytorch")
        and type(module).__name__ in ("Linear", "LayerNorm", "LayerNormLinear", "LayerNormMLP")
        for module in model.modules()
    )


def convert_model(
    model: torch.nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
) -> ParameterMoves:
    """Swap ``nn.Linear``/``nn.LayerNorm`` layers for TransformerEngine's, weights copied.

    Only the forward direction is supported (``to_transformer_engine=False`` raises);
    ``_convert_linear`` / ``_convert_ln`` choose which layer kinds are swapped.

    Returns:
        The replaced parameters, for optimizers built before the conversion.

    Raises:
        UnsupportedFeatureError: TransformerEngine is not installed, or the reverse direction.
    """
    if not to_transformer_engine:
        raise UnsupportedFeatureError(
            "convert_model(to_transformer_engine=False) is not supported by accel; save the "
            "weights (save_model) and load them into the plain model instead."
        )
    _require_te()
    import transformer_engine.pytorch as te

    moves: ParameterMoves = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and not _convert_linear:
                continue
            if type(child) is torch.nn.LayerNorm and not _convert_ln:
                continue
            replacement = _te_module(te, child)
            if replacement is None:
                continue
            for leaf, old in child.named_parameters(recurse=False):
                new = getattr(replacement, leaf)
                with torch.no_grad():
                    new.copy_(old)
                new.requires_grad_(old.requires_grad)
                moves[id(old)] = (weakref.ref(old), new)
            setattr(parent, name, replacement)
    return moves


def _te_module(te: Any, module: torch.nn.Module) -> torch.nn.Module | None:
    if type(module) is torch.nn.Linear:
        if module.in_features % _FP8_DIM_MULTIPLE or module.out_features % _FP8_DIM_MULTIPLE:
            return None
        return te.Linear(  # type: ignore[no-any-return]
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            params_dtype=module.weight.dtype,
        )
    if type(module) is torch.nn.LayerNorm and module.elementwise_affine:
        (hidden,) = module.normalized_shape
        return te.LayerNorm(  # type: ignore[no-any-return]
            hidden, eps=module.eps, params_dtype=module.weight.dtype
        )
    return None


def _te_recipe(handler: TERecipeKwargs) -> Any:
    from transformer_engine.common import recipe as te_recipe

    if handler.use_mxfp8_block_scaling:
        return te_recipe.MXFP8BlockScaling(
            fp8_format=te_recipe.Format[handler.fp8_format or "E4M3"]
        )
    return te_recipe.DelayedScaling(
        margin=handler.margin or 0,
        interval=handler.interval or 1,
        fp8_format=te_recipe.Format[handler.fp8_format or "HYBRID"],
        amax_history_len=handler.amax_history_len or 1024,
        amax_compute_algo=handler.amax_compute_algo or "most_recent",
    )


def contextual_fp8_autocast(
    model_forward: Callable[..., Any], fp8_recipe: Any, use_during_eval: bool = False
) -> Callable[..., Any]:
    """``model_forward`` run under TransformerEngine's fp8 autocast with ``fp8_recipe``.

    The autocast is on while the module is in training mode, and in evaluation mode too when
    ``use_during_eval`` is set.
    """
    _require_te()
    from transformer_engine.pytorch import fp8_autocast

    owner = getattr(model_forward, "__self__", None)

    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        enabled = use_during_eval or owner is None or bool(getattr(owner, "training", True))
        with fp8_autocast(enabled=enabled, fp8_recipe=fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]
    return forward


def apply_fp8_autowrap(
    model: torch.nn.Module, fp8_recipe_handler: TERecipeKwargs | FP8RecipeKwargs | None
) -> torch.nn.Module:
    """Run ``model.forward`` under fp8 autocast with the handler's recipe; returns the model.

    ``None`` uses the default recipe settings.
    """
    handler = (fp8_recipe_handler or TERecipeKwargs()).resolved({})
    model.forward = contextual_fp8_autocast(  # type: ignore[method-assign]
        model.forward, _te_recipe(handler), bool(handler.use_autocast_during_eval)
    )
    return model


class TEPrecision(BF16Precision):
    """TransformerEngine layers under fp8 autocast, bf16 autocast for the rest.

    Raises:
        UnsupportedFeatureError: TransformerEngine is not installed, or the device is not a
            CUDA GPU with compute capability 8.9 or newer.
    """

    mode = PrecisionType.FP8
    backend = "TE"

    def __init__(self, device: torch.device, recipe: TERecipeKwargs) -> None:
        super().__init__(device)
        if device.type != "cuda":
            raise UnsupportedFeatureError(
                f"mixed_precision='fp8' with TransformerEngine needs a CUDA GPU with compute "
                f"capability 8.9+, but this process runs on {device.type}. Use the torchao "
                "backend (AORecipeKwargs / --fp8_backend ao), which also runs on the CPU, or "
                "mixed_precision='bf16'."
            )
        _require_te()
        problem = fp8_device_problem(device)
        if problem is not None:
            raise UnsupportedFeatureError(
                f"mixed_precision='fp8' with TransformerEngine cannot run here: {problem}. Use "
                "mixed_precision='bf16' on this GPU."
            )
        self.recipe = recipe

    def prepare_model(self, model: torch.nn.Module) -> ParameterMoves:
        """Swap in TransformerEngine layers and wrap the forward in fp8 autocast."""
        moves = convert_model(model)
        apply_fp8_autowrap(model, self.recipe)
        return moves


__all__ = [
    "TE_INSTALL",
    "TEPrecision",
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
]
