"""Exception hierarchy of accel-data: every error this package raises derives from AccelDataError."""

from __future__ import annotations


class AccelDataError(Exception):
    """Base class of every error raised by accel-data."""


class DataConfigurationError(AccelDataError, ValueError):
    """Options passed to a dataloader helper contradict each other or the dataloader."""


class BatchSizeError(DataConfigurationError):
    """A batch size cannot be split or sharded the way the options ask for."""


class DispatchError(AccelDataError, RuntimeError):
    """The main process could not assemble or slice a batch to dispatch to the others."""


class ResumeStateError(AccelDataError, ValueError):
    """A dataloader state dictionary is malformed or does not fit the dataloader loading it."""


class RNGSyncError(AccelDataError, ValueError):
    """A random number generator cannot be synchronised (unknown type or missing generator)."""
