"""Decorators that refuse a call early when what it needs is missing (Accelerate's names).

They are defined in :mod:`accel.utils.imports`, where Accelerate keeps them; this module keeps
the path they had in accel.

Example:
    >>> from accel.utils import torchao_required
    >>> @torchao_required
    ... def convert(model): ...
"""

from __future__ import annotations

from accel.utils.imports import deepspeed_required, torchao_required

__all__ = ["deepspeed_required", "torchao_required"]
