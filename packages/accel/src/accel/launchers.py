"""Accelerate's ``accelerate.launchers`` module path: re-exports of :mod:`accel_launch`."""

from __future__ import annotations

from accel_launch.notebook import debug_launcher, notebook_launcher, test_launch
from accel_state import PartialState as PartialState

__all__ = ["debug_launcher", "notebook_launcher", "test_launch"]
