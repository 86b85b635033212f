"""One launcher for any torch script: accel launch, config, test, env.

Not built yet: see the open issue for this package."""

from accel_launch.__about__ import __version__

__all__ = ["__version__"]
