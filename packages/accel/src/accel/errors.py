"""Exception hierarchy of the accel package: every error it raises derives from AccelError."""

from __future__ import annotations

from accel_state.errors import TorchFeatureError


class AccelError(Exception):
    """Base class of every error raised by the accel package."""


class AcceleratorConfigError(AccelError, ValueError):
    """Accelerator arguments contradict each other or the launcher, or are out of range."""


class UnsupportedFeatureError(AccelError, RuntimeError):
    """A requested feature (precision, strategy, backend) is not available on this setup."""


class PreparationError(AccelError, TypeError):
    """An object passed to ``Accelerator.prepare`` cannot be prepared."""


class StateResetError(AcceleratorConfigError, AttributeError):
    """A setting of an ``AcceleratorState`` that ``AcceleratorState._reset_state()`` cleared.

    An ``AttributeError`` too, as Accelerate raises there: the setting is no longer an attribute.
    """


class AliasError(AccelError, RuntimeError):
    """``install_as_accelerate()`` cannot take effect (it ran after Accelerate was imported)."""


class TorchVersionError(UnsupportedFeatureError, TorchFeatureError):
    """A feature needs a newer torch than the one installed (``accel_state.torch_compat.GATES``).

    The message names the feature, the torch found, the release it needs and what works instead.
    """
