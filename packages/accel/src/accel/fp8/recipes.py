"""fp8 recipe settings by Accelerate's names: one kwargs handler per backend.

``AORecipeKwargs`` (torchao), ``TERecipeKwargs`` (TransformerEngine), ``MSAMPRecipeKwargs``
(MS-AMP) and the older ``FP8RecipeKwargs`` (any backend, chosen by ``backend``). Fields left
``None`` take the launcher's ``--fp8_*`` settings (``accel_state.contract``), then the defaults
below, when the Accelerator resolves them. Building one imports no fp8 library.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.kwargs_handlers import KwargsHandler

FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
OPT_LEVELS = ("O1", "O2")


class FP8BackendType(str, enum.Enum):
    """The fp8 engines: torchao (``AO``), TransformerEngine (``TE``), MS-AMP (``MSAMP``)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def _choice(owner: str, name: str, value: Any, allowed: tuple[str, ...], upper: bool) -> str:
    text = str(value).strip()
    text = text.upper() if upper else text.lower()
    if text not in allowed:
        raise AcceleratorConfigError(f"{owner}({name}={value!r}): use one of {', '.join(allowed)}.")
    return text


def _count(owner: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AcceleratorConfigError(f"{owner}({name}={value!r}): pass an integer >= {minimum}.")
    return value


@dataclasses.dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 training through torchao's ``Float8Linear`` (the ``AO`` backend).

    Args:
        config: A ``torchao.float8.Float8LinearConfig``; ``None`` builds one from the two
            fields below (the launcher's ``--fp8_pad_inner_dim`` /
            ``--fp8_enable_fsdp_float8_all_gather`` fill those left ``None``).
        module_filter_func: ``(module, fully_qualified_name) -> bool``: which ``nn.Linear``
            layers become ``Float8Linear``. Default:
            :func:`~accel.fp8.ao.filter_first_and_last_linear_layers` (every linear layer but
            the model's first and last). Layers whose dimensions are not divisible by 16 are
            always kept in high precision (``torch._scaled_mm`` needs that).
        pad_inner_dim: Pad inner matmul dimensions to multiples of 16 (default ``True``).
        enable_fsdp_float8_all_gather: Under FSDP2, all-gather converted weights in float8
            (half the traffic of bf16) and precompute their scales after each optimizer step
            (default ``True``). It only acts under FSDP2; elsewhere it is turned off.
    """

    config: Any = None
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def resolved(self, launcher: Mapping[str, Any]) -> AORecipeKwargs:
        """A copy with ``None`` fields taken from the launcher's settings, then the defaults."""

        def pick(name: str) -> bool:
            value = getattr(self, name)
            return bool(launcher.get(name, True)) if value is None else bool(value)

        return dataclasses.replace(
            self,
            pad_inner_dim=pick("pad_inner_dim"),
            enable_fsdp_float8_all_gather=pick("enable_fsdp_float8_all_gather"),
        )


@dataclasses.dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """fp8 training through MS-AMP (``msamp.initialize``).

    Args:
        opt_level: ``"O1"`` (fp8 weight gradients and all-reduce) or ``"O2"`` (also 8-bit
            first-order Adam state); default ``"O2"``.
    """

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is not None:
            self.opt_level = _choice(
                type(self).__name__, "opt_level", self.opt_level, OPT_LEVELS, upper=True
            )

    def resolved(self, launcher: Mapping[str, Any]) -> MSAMPRecipeKwargs:
        """A copy with ``None`` fields taken from the launcher's settings, then the defaults."""
        if self.opt_level is not None:
            return dataclasses.replace(self)
        return dataclasses.replace(self, opt_level=str(launcher.get("opt_level", "O2")))


_TE_DEFAULTS: dict[str, Any] = {
    "use_autocast_during_eval": False,
    "margin": 0,
    "interval": 1,
    "fp8_format": "HYBRID",
    "amax_history_len": 1024,
    "amax_compute_algo": "most_recent",
    "override_linear_precision": (False, False, False),
    "use_mxfp8_block_scaling": False,
}


@dataclasses.dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 training through TransformerEngine (its ``fp8_autocast`` and layers).

    Args:
        use_autocast_during_eval: Keep fp8 autocast on in ``eval()`` mode (default ``False``).
        margin: Scaling-factor margin (default 0).
        interval: Steps between scaling-factor updates (default 1).
        fp8_format: ``"HYBRID"`` (E4M3 forward, E5M2 backward), ``"E4M3"`` or ``"E5M2"``.
        amax_history_len: Length of the amax history (default 1024).
        amax_compute_algo: ``"max"`` or ``"most_recent"``.
        override_linear_precision: Run the fprop/dgrad/wgrad GEMMs in higher precision.
        use_mxfp8_block_scaling: MXFP8 block scaling (Blackwell GPUs).
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        self._check_te_fields()

    def _check_te_fields(self) -> None:
        owner = type(self).__name__
        if self.fp8_format is not None:
            self.fp8_format = _choice(owner, "fp8_format", self.fp8_format, FP8_FORMATS, True)
        if self.amax_compute_algo is not None:
            self.amax_compute_algo = _choice(
                owner, "amax_compute_algo", self.amax_compute_algo, AMAX_COMPUTE_ALGOS, False
            )
        for name, minimum in (("margin", 0), ("interval", 1), ("amax_history_len", 1)):
            if getattr(self, name) is not None:
                _count(owner, name, getattr(self, name), minimum)
        override = self.override_linear_precision
        if override is not None:
            if len(override) != 3 or not all(isinstance(flag, bool) for flag in override):
                raise AcceleratorConfigError(
                    f"{owner}(override_linear_precision={override!r}): pass three booleans "
                    "(fprop, dgrad, wgrad)."
                )
            self.override_linear_precision = (override[0], override[1], override[2])

    def resolved(self, launcher: Mapping[str, Any]) -> TERecipeKwargs:
        """A copy with ``None`` fields taken from the launcher's settings, then the defaults."""
        values: dict[str, Any] = {}
        for name, default in _TE_DEFAULTS.items():
            value = getattr(self, name)
            if value is None:
                value = launcher.get(name, default)
                if name == "override_linear_precision":
                    value = tuple(value)
            values[name] = value
        return dataclasses.replace(self, **values)


@dataclasses.dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Accelerate's older all-backend fp8 recipe: ``backend`` picks the engine.

    Args:
        backend: ``"TE"``, ``"MSAMP"`` or (an accel extension) ``"AO"``; ``None`` takes the
            launcher's ``--fp8_backend``. The other fields are those of
            :class:`TERecipeKwargs` and :class:`MSAMPRecipeKwargs`.
    """

    backend: str | None = None

    def __post_init__(self) -> None:
        MSAMPRecipeKwargs.__post_init__(self)
        self._check_te_fields()
        if self.backend is not None:
            self.backend = _choice(
                type(self).__name__,
                "backend",
                self.backend,
                tuple(kind.value for kind in FP8BackendType if kind is not FP8BackendType.NO),
                upper=True,
            )

    def resolved(self, launcher: Mapping[str, Any]) -> FP8RecipeKwargs:
        """A copy with ``None`` fields taken from the launcher's settings, then the defaults."""
        te = TERecipeKwargs.resolved(self, launcher)
        msamp = MSAMPRecipeKwargs.resolved(self, launcher)
        values = {
            field.name: getattr(te, field.name) for field in dataclasses.fields(TERecipeKwargs)
        }
        values["opt_level"] = msamp.opt_level
        return dataclasses.replace(self, **values)

    def for_backend(self) -> AORecipeKwargs | TERecipeKwargs | MSAMPRecipeKwargs:
        """The backend's own recipe with this recipe's settings."""
        if self.backend == FP8BackendType.AO.value:
            return AORecipeKwargs()
        if self.backend == FP8BackendType.MSAMP.value:
            return MSAMPRecipeKwargs(opt_level=self.opt_level)
        return TERecipeKwargs(
            **{
                field.name: getattr(self, field.name)
                for field in dataclasses.fields(TERecipeKwargs)
            }
        )


FP8_HANDLER_TYPES: tuple[type[KwargsHandler], ...] = (
    FP8RecipeKwargs,
    AORecipeKwargs,
    TERecipeKwargs,
    MSAMPRecipeKwargs,
)

__all__ = [
    "AMAX_COMPUTE_ALGOS",
    "FP8_FORMATS",
    "FP8_HANDLER_TYPES",
    "OPT_LEVELS",
    "AORecipeKwargs",
    "FP8BackendType",
    "FP8RecipeKwargs",
    "MSAMPRecipeKwargs",
    "TERecipeKwargs",
]
