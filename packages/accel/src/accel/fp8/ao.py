"""fp8 training through torchao: ``nn.Linear`` layers become ``Float8Linear`` at ``prepare``.

:class:`Float8Converter` checks torchao and the device when it is built, selects the layers by
fully-qualified name and shape, and converts them in place before any wrapping (under FSDP2,
before ``fully_shard``, so weights can be all-gathered in float8). :class:`AOPrecision` is the
precision object the Accelerator uses: bf16 autocast for everything else, as in Accelerate.

The converted model's ``state_dict`` holds plain tensors under the original names, so its
checkpoints load into the unconverted model.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from accel.errors import UnsupportedFeatureError
from accel.fp8.capability import fp8_device_problem, require_package
from accel.fp8.recipes import AORecipeKwargs
from accel.placement import ParameterMoves
from accel.precision import BF16Precision
from accel.torch_compat import GATES, require_torch_feature
from accel_state import PrecisionType

logger = logging.getLogger(__name__)

#: ``torch._scaled_mm`` needs both dimensions of each operand divisible by 16.
FP8_DIM_MULTIPLE = 16
TORCHAO_INSTALL = "pip install 'accel[fp8]' (or pip install 'torchao>=0.18,<0.19')"
#: The oldest torch that torchao 0.18 (the release ``accel[fp8]`` pins) supports: it says so when
#: it loads, and older torch releases lack APIs it calls at import (an AttributeError there).
TORCHAO_MIN_TORCH = GATES["fp8_torchao"].minimum
ModuleFilter = Callable[[torch.nn.Module, str], bool]


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """The names of the first and last ``nn.Linear`` in ``model.named_modules()`` order."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def filter_linear_layers(
    module: torch.nn.Module, fqn: str, layers_to_filter: Sequence[str]
) -> bool:
    """Whether ``module`` (named ``fqn``) may become fp8.

    It may unless it is a linear layer with a dimension not divisible by 16, or its name is in
    ``layers_to_filter``.
    """
    if isinstance(module, torch.nn.Linear) and (
        module.in_features % FP8_DIM_MULTIPLE or module.out_features % FP8_DIM_MULTIPLE
    ):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """The default ``module_filter_func``: every linear layer but the model's first and last.

    Keeping the first and last layers in high precision keeps fp8 training stable. Given as
    ``AORecipeKwargs(module_filter_func=...)`` (or left as the default), the converter applies
    it with the first and last linear layers of the model being converted. Called directly,
    ``module`` is taken as that model: its own first and last linear layers are filtered.
    """
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, [name for name in (first, last) if name is not None])


def _first_and_last_filter(model: torch.nn.Module) -> ModuleFilter:
    first, last = find_first_last_linear_layers(model)
    skipped = [name for name in (first, last) if name is not None]
    return functools.partial(filter_linear_layers, layers_to_filter=skipped)


def _require_torchao() -> str:
    """The installed torchao version, once ``torchao.float8`` imports with this torch.

    Raises:
        UnsupportedFeatureError: torchao is missing, or built for another torch release.
    """
    version = require_package("torchao", "torchao", "torchao (AO)", TORCHAO_INSTALL)
    require_torch_feature("fp8_torchao")
    try:
        import torchao.float8  # noqa: F401 - the import is the check
    except (ImportError, AttributeError) as error:  # AttributeError: an API this torch lacks
        raise UnsupportedFeatureError(
            f"mixed_precision='fp8' with torchao: torchao {version} does not import with torch "
            f"{torch.__version__} ({error}). Install the torchao release made for this torch "
            "(torchao 0.18 pairs with torch 2.13)."
        ) from None
    return version


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds torchao ``Float8Linear`` layers."""
    _require_torchao()
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


class Float8Converter:
    """Converts a model's linear layers to torchao's ``Float8Linear``, checked up front.

    Args:
        recipe: The settings (resolved: no ``None`` left in the two flags).
        device: Where the model trains; it must run fp8 matmuls (or the config must emulate).
        fsdp2: Whether models are sharded with FSDP2 (float8 all-gather acts only there).

    Raises:
        UnsupportedFeatureError: torchao is not installed, or the device has no fp8 kernels.
    """

    def __init__(self, recipe: AORecipeKwargs, *, device: torch.device, fsdp2: bool) -> None:
        self.torchao_version = _require_torchao()
        self.config = self._float8_config(recipe, fsdp2)
        problem = fp8_device_problem(device, emulate=bool(self.config.emulate))
        if problem is not None:
            raise UnsupportedFeatureError(
                f"mixed_precision='fp8' (torchao) cannot run here: {problem}. Train on such a "
                "device, pass AORecipeKwargs(config=Float8LinearConfig(emulate=True)) to emulate "
                "fp8 in higher precision (for testing), or use mixed_precision='bf16'."
            )
        self.module_filter = recipe.module_filter_func
        self.fsdp_float8_all_gather = bool(self.config.enable_fsdp_float8_all_gather)
        #: Names of the layers converted by the last :meth:`convert`, and those left alone.
        self.converted: list[str] = []
        self.skipped: list[str] = []

    @staticmethod
    def _float8_config(recipe: AORecipeKwargs, fsdp2: bool) -> Any:
        from torchao.float8 import Float8LinearConfig

        config = recipe.config
        if config is None:
            config = Float8LinearConfig(
                pad_inner_dim=bool(recipe.pad_inner_dim),
                enable_fsdp_float8_all_gather=bool(recipe.enable_fsdp_float8_all_gather),
            )
        if config.enable_fsdp_float8_all_gather and not fsdp2:
            # Outside FSDP2 there is no all-gather; the setting would only turn the weights into
            # a tensor subclass that DDP and checkpoints then have to look through.
            config = dataclasses.replace(config, enable_fsdp_float8_all_gather=False)
        return config

    def _wanted(self, model: torch.nn.Module) -> ModuleFilter:
        chosen = self.module_filter
        if chosen is None or chosen is filter_first_and_last_linear_layers:
            return _first_and_last_filter(model)
        return chosen

    def select(self, model: torch.nn.Module) -> list[str]:
        """Names of the ``nn.Linear`` layers of ``model`` that :meth:`convert` turns to fp8."""
        wanted = self._wanted(model)
        selected: list[str] = []
        self.skipped = []
        for name, module in model.named_modules():
            if type(module) is not torch.nn.Linear:
                continue
            shape_ok = not (
                module.in_features % FP8_DIM_MULTIPLE or module.out_features % FP8_DIM_MULTIPLE
            )
            (selected if shape_ok and wanted(module, name) else self.skipped).append(name)
        return selected

    def convert(self, model: torch.nn.Module) -> ParameterMoves:
        """Swap the selected layers for ``Float8Linear`` in place.

        Returns:
            The parameters replaced by new objects (float8 all-gather wraps the weights), for
            optimizers built before ``prepare``.
        """
        from torchao.float8 import convert_to_float8_training

        selected = set(self.select(model))
        before = {name: parameter for name, parameter in model.named_parameters()}
        convert_to_float8_training(
            model, module_filter_fn=lambda _module, fqn: fqn in selected, config=self.config
        )
        self.converted = sorted(selected)
        if not selected:
            logger.warning(
                "mixed_precision='fp8': no linear layer of %s was converted (layers need "
                "dimensions divisible by 16 and must pass the module filter; the first and last "
                "are kept by default). It trains in bf16 autocast only.",
                type(model).__name__,
            )
        moves: ParameterMoves = {}
        for name, parameter in model.named_parameters():
            old = before.get(name)
            if old is not None and old is not parameter:
                moves[id(old)] = (weakref.ref(old), parameter)
        return moves

    def precompute_fsdp_scales(self, model: torch.nn.Module) -> None:
        """Compute the float8 scales of every FSDP2-sharded weight of ``model`` in one go."""
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Any = None,
    module_filter_func: ModuleFilter | None = None,
) -> None:
    """Convert ``model``'s linear layers to torchao ``Float8Linear`` in place.

    Args:
        model: The model (on the device it will train on).
        config: A ``torchao.float8.Float8LinearConfig`` (default: padded inner dimensions, no
            float8 all-gather).
        module_filter_func: ``(module, fqn) -> bool``; default
            :func:`filter_first_and_last_linear_layers`.

    Raises:
        UnsupportedFeatureError: torchao is missing, or the model's device has no fp8 kernels.
    """
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    recipe = AORecipeKwargs(
        config=config,
        module_filter_func=module_filter_func,
        pad_inner_dim=True,
        enable_fsdp_float8_all_gather=False,
    )
    # fsdp2=True: a config given here is used as it is (the caller shards the model, or not).
    Float8Converter(recipe, device=device, fsdp2=True).convert(model)


class AOPrecision(BF16Precision):
    """fp8 linear layers (torchao) and bf16 autocast for the rest of the model.

    Args:
        device: The process's device.
        recipe: Resolved :class:`~accel.fp8.recipes.AORecipeKwargs`.
        fsdp2: Whether models are sharded with FSDP2.
    """

    mode = PrecisionType.FP8
    backend = "AO"

    def __init__(self, device: torch.device, recipe: AORecipeKwargs, *, fsdp2: bool) -> None:
        super().__init__(device)
        self.recipe = recipe
        self.converter = Float8Converter(recipe, device=device, fsdp2=fsdp2)
        self._fsdp2 = fsdp2
        self._converted: list[weakref.ref[torch.nn.Module]] = []

    def prepare_model(self, model: torch.nn.Module) -> ParameterMoves:
        """Convert ``model`` before it is wrapped (and, under FSDP2, sharded)."""
        moves = self.converter.convert(model)
        self._converted.append(weakref.ref(model))
        return moves

    def _precomputes_scales(self) -> bool:
        return self._fsdp2 and self.converter.fsdp_float8_all_gather

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Under FSDP2 with float8 all-gather, precompute the weights' scales after each step.

        One fused pass over all weights instead of one reduction per layer in the next forward
        (torchao's recipe for FSDP2). They are computed once now too, and again after
        ``load_state``, so that every forward uses precomputed scales: a run resumed from a
        checkpoint then computes exactly what the uninterrupted run computed.
        """
        if not self._precomputes_scales():
            return
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        models = [
            model
            for ref in self._converted
            if (model := ref()) is not None and any(id(p) in owned for p in model.parameters())
        ]
        converter = self.converter

        def precompute(*_args: Any, **_kwargs: Any) -> None:
            for model in models:
                converter.precompute_fsdp_scales(model)

        if models:
            optimizer.register_step_post_hook(precompute)
            precompute()

    def state_loaded(self) -> None:
        """Recompute the FSDP2 float8 scales of the loaded weights."""
        if not self._precomputes_scales():
            return
        for ref in self._converted:
            model = ref()
            if model is not None:
                self.converter.precompute_fsdp_scales(model)


__all__ = [
    "TORCHAO_INSTALL",
    "AOPrecision",
    "Float8Converter",
    "convert_model_to_fp8_ao",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]
