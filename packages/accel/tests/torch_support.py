"""Why a test of a feature that needs a newer torch (or an optional package) cannot run here."""

from __future__ import annotations

import importlib.util

from accel.torch_compat import GATES


def torchao_skip_reason() -> str | None:
    """Why fp8 through torchao cannot run with this torch, or ``None`` when it can."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'accel[fp8]')"
    gate = GATES["fp8_torchao"]
    if not gate.available():
        return f"{gate.message()} (accel refuses it with that reason)"
    return None
