"""Accelerate's ``accelerate.launchers`` module path: re-exports of :mod:`accel_launch`."""

from __future__ import annotations

from accel_launch import debug_launcher, notebook_launcher
from accel_state import PartialState


def test_launch() -> None:
    """Check that a ``PartialState`` starts in this process (what a launched function first does)."""
    PartialState()


__all__ = ["debug_launcher", "notebook_launcher", "test_launch"]
