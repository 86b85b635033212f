"""Accelerate's ``accelerate.launchers`` module path: re-exports of :mod:`accel_launch`."""

from __future__ import annotations

from accel_launch import debug_launcher, notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher"]
