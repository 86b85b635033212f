"""Mixed precision as small objects: how to autocast, scale the loss, and step the optimizer."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from accel.errors import UnsupportedFeatureError
from accel.kwargs_handlers import AutocastKwargs, GradScalerKwargs
from accel.placement import ParameterMoves
from accel_state import PrecisionType

#: The autocast dtype of each mixed-precision mode: the one map every layer reads. fp8 runs its
#: fp8 layers' matmuls in float8 and everything else in bfloat16 (Accelerate's rule).
AUTOCAST_DTYPES: Mapping[PrecisionType, torch.dtype | None] = MappingProxyType(
    {
        PrecisionType.NO: None,
        PrecisionType.FP16: torch.float16,
        PrecisionType.BF16: torch.bfloat16,
        PrecisionType.FP8: torch.bfloat16,
    }
)


def autocast_dtype(mode: PrecisionType | str) -> torch.dtype | None:
    """The dtype ``mode`` computes in outside fp8 matmuls (``None``: full precision).

    Raises:
        ValueError: ``mode`` is not a precision mode.
    """
    return AUTOCAST_DTYPES[PrecisionType(mode)]


class Precision:
    """Full precision: no autocast, no loss scaling. Subclasses override what they change."""

    mode: PrecisionType = PrecisionType.NO
    autocast_dtype: torch.dtype | None = None

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.scaler: Any = None

    def autocast(
        self, handler: AutocastKwargs | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Context manager running its block in this precision."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        settings = (handler or AutocastKwargs()).to_kwargs()
        enabled = settings.pop("enabled", True)
        return torch.autocast(
            device_type=self.device.type, dtype=self.autocast_dtype, enabled=enabled, **settings
        )

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward`` on (scaled under fp16)."""
        return loss

    def prepare_model(self, model: torch.nn.Module) -> ParameterMoves:
        """Change ``model`` for this precision before it is wrapped (fp8 converts layers here).

        Returns:
            Parameters replaced by new objects, for optimizers built before ``prepare``.
        """
        return {}

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook when an optimizer is prepared, after the models (fp8 under FSDP2 adds a hook)."""

    def state_loaded(self) -> None:
        """Hook after ``load_state`` changed the prepared models' weights."""

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """See a ``prepare`` call's objects before any is prepared; returns them.

        Some may come back replaced (MS-AMP converts the model and optimizer together here).
        """
        return objects

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale (no-op without a scaler)."""

    def gradient_scale(self) -> float:
        """The factor not-yet-unscaled gradients carry (1 without a scaler)."""
        return 1.0

    def step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step the optimizer; return True when the step was skipped (inf/nan gradients)."""
        optimizer.step(**kwargs)
        return False


class BF16Precision(Precision):
    """bfloat16 autocast; same exponent range as float32, so no loss scaling."""

    mode = PrecisionType.BF16
    autocast_dtype = AUTOCAST_DTYPES[PrecisionType.BF16]


class FP16Precision(Precision):
    """float16 autocast with a dynamic loss scaler (``torch.amp.GradScaler``)."""

    mode = PrecisionType.FP16
    autocast_dtype = AUTOCAST_DTYPES[PrecisionType.FP16]

    def __init__(self, device: torch.device, scaler_kwargs: GradScalerKwargs | None = None) -> None:
        super().__init__(device)
        self.scaler = torch.amp.GradScaler(
            device.type, **(scaler_kwargs or GradScalerKwargs()).to_kwargs()
        )
        self._unscaled: set[int] = set()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Multiply the loss by the current scale."""
        return self.scaler.scale(loss)  # type: ignore[no-any-return]

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale once per optimizer step (a second call before the step is a no-op)."""
        if id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def gradient_scale(self) -> float:
        """The current loss scale; 1 when disabled or already unscaled since the last step."""
        if self._unscaled or not self.scaler.is_enabled():
            return 1.0
        return float(self.scaler.get_scale())

    def step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step through the scaler; return True when inf/nan gradients made it skip.

        The scaler already reads its inf/nan flags on the host once to decide whether to call
        ``optimizer.step``; whether that call happened is the answer, with no further device
        synchronisation (reading the scale before and after would add two).
        """
        with _StepObserver(optimizer) as observer:
            self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        return not observer.stepped


class _StepObserver:
    """Within its block, notes whether ``optimizer.step`` was called (by the grad scaler).

    It shadows ``step`` with an instance attribute and restores exactly what was there before
    (a scheduler's instance-level wrapper, or nothing, leaving the class's method).
    """

    _MISSING = object()

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.stepped = False
        self._previous: Any = self._MISSING

    def __enter__(self) -> _StepObserver:
        self._previous = self.optimizer.__dict__.get("step", self._MISSING)
        inner = self.optimizer.step

        def observed_step(*args: Any, **kwargs: Any) -> Any:
            self.stepped = True
            return inner(*args, **kwargs)

        self.optimizer.step = observed_step  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is self._MISSING:
            del self.optimizer.step
        else:
            self.optimizer.step = self._previous  # type: ignore[method-assign]


def make_precision(
    mode: PrecisionType | str,
    device: torch.device,
    scaler_kwargs: GradScalerKwargs | None = None,
) -> Precision:
    """Build the precision object for ``mode`` on ``device``.

    Raises:
        UnsupportedFeatureError: fp8 (built by :func:`accel.fp8.make_fp8_precision`, which
            needs the chosen backend), or fp16/bf16 on a device type without autocast support.
    """
    precision = PrecisionType(mode)
    if precision is PrecisionType.FP8:
        raise UnsupportedFeatureError(
            "mixed_precision='fp8' needs an fp8 backend: build it with "
            "accel.fp8.make_fp8_precision (strategy.make_precision does, from RunConfig.fp8)."
        )
    if precision is PrecisionType.NO:
        return Precision(device)
    dtype = AUTOCAST_DTYPES[precision]
    assert dtype is not None
    if not _autocast_supported(device, dtype):
        raise UnsupportedFeatureError(
            f"mixed_precision={precision.value!r} is not supported by torch {torch.__version__} on "
            f"{device.type}; use mixed_precision='no' or 'bf16'."
        )
    if precision is PrecisionType.FP16:
        return FP16Precision(device, scaler_kwargs)
    return BF16Precision(device)


def _autocast_supported(device: torch.device, dtype: torch.dtype) -> bool:
    try:
        with torch.autocast(device_type=device.type, dtype=dtype):
            pass
    except (RuntimeError, ValueError):
        return False
    return True
