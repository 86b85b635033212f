"""Sharded dataloaders, samplers, RNG synchronisation and exact resume for distributed PyTorch.

Not built yet: see the open issue for this package."""

from accel_data.__about__ import __version__

__all__ = ["__version__"]
