"""Run your raw PyTorch training loop on any device and any number of processes.

Not built yet: see the open issue for this package."""

from accel.__about__ import __version__

__all__ = ["__version__"]
