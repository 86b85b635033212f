"""Why a test of a feature that needs a newer torch (or an optional package) cannot run here."""

from __future__ import annotations

import importlib.util

import torch

from accel.fp8.ao import TORCHAO_MIN_TORCH
from accel.utils.imports import is_torch_version


def torchao_skip_reason() -> str | None:
    """Why fp8 through torchao cannot run with this torch, or ``None`` when it can."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'accel[fp8]')"
    if not is_torch_version(">=", TORCHAO_MIN_TORCH):
        return (
            f"fp8 through torchao 0.18 needs torch>={TORCHAO_MIN_TORCH}; this is torch "
            f"{torch.__version__} (accel refuses it with that reason)"
        )
    return None
