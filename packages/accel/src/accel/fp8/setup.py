"""Which fp8 backend and recipe a job uses, and the ``fp8_*`` attributes of the Accelerator.

The choice, made once when the Accelerator is created: a recipe passed in ``kwargs_handlers``
names its backend; else the launcher's ``--fp8_backend``; else the first installed of torchao,
TransformerEngine and MS-AMP (Accelerate's order). The backend's precision object then checks
its library and the device, and refuses the job when either is missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.fp8.capability import installed_version
from accel.fp8.recipes import (
    AORecipeKwargs,
    FP8BackendType,
    FP8RecipeKwargs,
    MSAMPRecipeKwargs,
    TERecipeKwargs,
)
from accel.kwargs_handlers import KwargsHandler
from accel.precision import Precision
from accel_state import DistributedType, LaunchContract, PrecisionType

Recipe = AORecipeKwargs | TERecipeKwargs | MSAMPRecipeKwargs
_AUTO_ORDER = (
    (FP8BackendType.AO, "torchao", "torchao"),
    (FP8BackendType.TE, "transformer_engine", "transformer-engine"),
    (FP8BackendType.MSAMP, "msamp", "msamp"),
)
_ATTRIBUTES = {
    FP8RecipeKwargs: "fp8_recipe_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
}


@dataclasses.dataclass(frozen=True)
class FP8Setup:
    """The job's fp8 choice: ``backend`` is ``NO`` when fp8 is off.

    Attributes:
        backend: The engine.
        recipe: The backend's resolved recipe (``None`` when fp8 is off).
        given: The recipe object as passed in ``kwargs_handlers`` (``None``: none was).
    """

    backend: FP8BackendType = FP8BackendType.NO
    recipe: Recipe | None = None
    given: KwargsHandler | None = None

    @property
    def enabled(self) -> bool:
        """Whether the job trains in fp8."""
        return self.backend is not FP8BackendType.NO

    def handler(self, attribute: str) -> Any:
        """The recipe the Accelerator shows as ``attribute`` (Accelerate's four names).

        ``fp8_recipe_handler`` is the ``FP8RecipeKwargs`` passed, if any; the backend's own
        attribute (``ao_recipe_handler``...) is the resolved recipe in effect.
        """
        if attribute == "fp8_recipe_handler":
            return self.given if isinstance(self.given, FP8RecipeKwargs) else None
        if self.recipe is None or _ATTRIBUTES[_kind(self.recipe)] != attribute:
            return None
        return self.recipe


def _kind(handler: KwargsHandler) -> type[KwargsHandler]:
    return next(kind for kind in _ATTRIBUTES if isinstance(handler, kind))


def _auto_backend() -> FP8BackendType:
    for backend, module, _distribution in _AUTO_ORDER:
        if installed_version(module, module) is not None:
            return backend
    raise UnsupportedFeatureError(
        "mixed_precision='fp8' needs an fp8 engine and none is installed. On any machine "
        "(CPU included): pip install 'accel[fp8]' (torchao); on GPUs with compute capability "
        "8.9+ TransformerEngine or MS-AMP also work. accel does not fall back to bf16 silently; "
        "pass mixed_precision='bf16' to train without fp8."
    )


def resolve_fp8(
    handlers: Mapping[type, KwargsHandler],
    mixed_precision: PrecisionType,
    contract: LaunchContract,
) -> FP8Setup:
    """Pick the fp8 backend and recipe from the handlers, the launcher and what is installed.

    Raises:
        AcceleratorConfigError: Two fp8 recipes, or a recipe without ``mixed_precision='fp8'``.
        UnsupportedFeatureError: fp8 requested and no fp8 engine installed.
    """
    given = [handler for kind, handler in handlers.items() if kind in _ATTRIBUTES]
    if len(given) > 1:
        raise AcceleratorConfigError(
            f"kwargs_handlers holds {len(given)} fp8 recipes "
            f"({', '.join(type(h).__name__ for h in given)}); pass the one for your backend."
        )
    recipe = given[0] if given else None
    if mixed_precision is not PrecisionType.FP8:
        if recipe is not None:
            raise AcceleratorConfigError(
                f"{type(recipe).__name__} was passed but mixed_precision is "
                f"{mixed_precision.value!r}; pass mixed_precision='fp8' (or --mixed_precision fp8)."
            )
        return FP8Setup()
    launcher = contract.fp8_config
    if isinstance(recipe, FP8RecipeKwargs):
        resolved = recipe.resolved(launcher)
        if resolved.backend is None:
            resolved = dataclasses.replace(resolved, backend=contract.fp8_backend or "MSAMP")
        backend = FP8BackendType(resolved.backend)
        return FP8Setup(backend, resolved.for_backend().resolved(launcher), recipe)
    if recipe is not None:
        backend = {
            AORecipeKwargs: FP8BackendType.AO,
            TERecipeKwargs: FP8BackendType.TE,
            MSAMPRecipeKwargs: FP8BackendType.MSAMP,
        }[_kind(recipe)]
        return FP8Setup(backend, recipe.resolved(launcher), recipe)  # type: ignore[attr-defined]
    backend = FP8BackendType(contract.fp8_backend) if contract.fp8_backend else _auto_backend()
    fresh: Recipe = {
        FP8BackendType.AO: AORecipeKwargs,
        FP8BackendType.TE: TERecipeKwargs,
        FP8BackendType.MSAMP: MSAMPRecipeKwargs,
    }[backend]()
    return FP8Setup(backend, fresh.resolved(launcher), None)


def make_fp8_precision(
    setup: FP8Setup, device: torch.device, distributed_type: DistributedType, *, fsdp2: bool
) -> Precision:
    """The precision object of the chosen backend; it checks its library and the device.

    Raises:
        UnsupportedFeatureError: The library is missing, the device cannot run fp8, or the
            distributed mode is one fp8 is not supported with.
    """
    if distributed_type in (DistributedType.DEEPSPEED, DistributedType.XLA):
        raise UnsupportedFeatureError(
            f"mixed_precision='fp8' is not supported with {distributed_type.value} in accel; "
            "train in fp8 with DDP or FSDP2, or use mixed_precision='bf16'."
        )
    if distributed_type is DistributedType.FSDP and not fsdp2:
        raise UnsupportedFeatureError(
            "mixed_precision='fp8' under FSDP needs FSDP2 (fsdp_version=2, the default); "
            "FSDP1's flat parameters hide the linear layers' weights from the fp8 engine."
        )
    if setup.backend is FP8BackendType.AO:
        from accel.fp8.ao import AOPrecision

        assert isinstance(setup.recipe, AORecipeKwargs)
        return AOPrecision(device, setup.recipe, fsdp2=fsdp2)
    if setup.backend is FP8BackendType.TE:
        from accel.fp8.transformer_engine import TEPrecision

        assert isinstance(setup.recipe, TERecipeKwargs)
        return TEPrecision(device, setup.recipe)
    from accel.fp8.msamp import MSAMPPrecision

    assert isinstance(setup.recipe, MSAMPRecipeKwargs)
    return MSAMPPrecision(device, setup.recipe, distributed_type)


class FP8AttributesMixin:
    """Accelerate's ``fp8_*`` attributes of the Accelerator, read from its :class:`FP8Setup`."""

    _fp8: FP8Setup

    @property
    def fp8_enabled(self) -> bool:
        """Whether the job trains in fp8."""
        return self._fp8.enabled

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The fp8 engine (``FP8BackendType.NO`` without fp8)."""
        return self._fp8.backend

    @property
    def has_fp8_handler(self) -> bool:
        """Whether an fp8 recipe is in effect (given, or made for the chosen backend)."""
        return self._fp8.recipe is not None

    @property
    def fp8_recipe_handler(self) -> FP8RecipeKwargs | None:
        """The ``FP8RecipeKwargs`` passed in ``kwargs_handlers``, if any."""
        return self._fp8.handler("fp8_recipe_handler")  # type: ignore[no-any-return]

    @property
    def ao_recipe_handler(self) -> AORecipeKwargs | None:
        """The torchao recipe in effect (``None`` unless the backend is ``AO``)."""
        return self._fp8.handler("ao_recipe_handler")  # type: ignore[no-any-return]

    @property
    def te_recipe_handler(self) -> TERecipeKwargs | None:
        """The TransformerEngine recipe in effect (``None`` unless the backend is ``TE``)."""
        return self._fp8.handler("te_recipe_handler")  # type: ignore[no-any-return]

    @property
    def msamp_recipe_handler(self) -> MSAMPRecipeKwargs | None:
        """The MS-AMP recipe in effect (``None`` unless the backend is ``MSAMP``)."""
        return self._fp8.handler("msamp_recipe_handler")  # type: ignore[no-any-return]

    @property
    def delayed_fp8_autocast(self) -> bool:
        """Whether TransformerEngine's fp8 autocast wraps the model after DDP/FSDP wrapping."""
        return self._fp8.backend is FP8BackendType.TE


__all__ = ["FP8AttributesMixin", "FP8Setup", "make_fp8_precision", "resolve_fp8"]
