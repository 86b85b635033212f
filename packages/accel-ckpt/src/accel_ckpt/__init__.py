"""Model and training-state checkpoints: sharded safetensors, atomic, safe to load.

Not built yet: see the open issue for this package."""

from accel_ckpt.__about__ import __version__

__all__ = ["__version__"]
