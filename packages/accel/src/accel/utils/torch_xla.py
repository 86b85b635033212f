"""Accelerate's ``accelerate.utils.torch_xla`` module path: a door to :mod:`accel.xla_install`."""

from __future__ import annotations

from accel.errors import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.patch_forwarding import serve_as_door
from accel.xla_install import (
    install_xla,
)

__all__ = ["install_xla"]

serve_as_door(__name__, "accel.xla_install")
