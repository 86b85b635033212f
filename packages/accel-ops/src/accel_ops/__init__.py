"""Collectives over nested tensors: gather, broadcast, reduce, pad, move to device.

Not built yet: see the open issue for this package."""

from accel_ops.__about__ import __version__

__all__ = ["__version__"]
