"""Exception hierarchy of accel-ckpt: every error this package raises derives from AccelCkptError.

Each class also derives from the built-in exception a caller would naturally catch
(``FileNotFoundError``, ``ValueError``, ``pickle.UnpicklingError``...), so existing ``except``
clauses keep working.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable


class AccelCkptError(Exception):
    """Base class of every error raised by accel-ckpt."""


class InvalidArgumentError(AccelCkptError, ValueError):
    """An argument has a value this package cannot use (bad size string, device map, ...)."""


class CheckpointNotFoundError(AccelCkptError, FileNotFoundError):
    """The checkpoint path, or the project's checkpoint folder, does not exist or holds none."""


class CheckpointExistsError(AccelCkptError, FileExistsError):
    """Automatic naming would overwrite a checkpoint that already exists."""


class IncompleteCheckpointError(AccelCkptError, RuntimeError):
    """The checkpoint was never committed (no manifest) or a file it lists is missing."""


class CorruptCheckpointError(IncompleteCheckpointError):
    """A checkpoint file has the wrong size, checksum or header: it was damaged after writing."""


class UnsafeCheckpointError(AccelCkptError, pickle.UnpicklingError):
    """Loading would execute pickled code; refused unless ``allow_pickle=True`` is passed."""


class PathEscapeError(AccelCkptError, ValueError):
    """A name in a checkpoint (or given for one) resolves outside its folder: refused."""


class CheckpointDiskFullError(AccelCkptError, OSError):
    """The file system ran out of space (or the file-size limit was hit) while saving.

    Nothing was committed: the staging folder is removed and the previous checkpoint stays the
    newest complete one. ``errno`` is the underlying one (``ENOSPC``, ``EDQUOT`` or ``EFBIG``).
    """


class UnsupportedValueError(AccelCkptError, TypeError):
    """A state holds a value the safe formats cannot store (tensors, numbers, strings, lists...)."""


class StateDictMismatchError(AccelCkptError, RuntimeError):
    """The checkpoint's keys or shapes do not match the model it is loaded into.

    Attributes:
        missing_keys: Keys the model has and the checkpoint lacks.
        unexpected_keys: Keys the checkpoint has and the model lacks.

    """

    def __init__(
        self,
        message: str,
        missing_keys: Iterable[str] = (),
        unexpected_keys: Iterable[str] = (),
    ) -> None:
        super().__init__(message)
        self.missing_keys = sorted(missing_keys)
        self.unexpected_keys = sorted(unexpected_keys)


class CheckpointContentsError(AccelCkptError, ValueError):
    """The objects passed to ``load_state`` do not match what the checkpoint holds."""


class InvalidSavePlanError(CheckpointContentsError):
    """The chunks the processes would save do not tile their tensors (bounds, overlap, cover)."""


class DistributedCheckpointError(AccelCkptError, RuntimeError):
    """Another process failed while saving; nothing was committed."""


class AsyncSaveError(AccelCkptError, RuntimeError):
    """A background save failed; raised by ``wait()`` or by the next save or load."""


class DeviceMapError(InvalidArgumentError):
    """A device map misses a parameter, names an unknown device, or cannot run as given."""


class InsufficientMemoryError(AccelCkptError, ValueError):
    """The memory allowed by ``max_memory`` (and the offload options) cannot hold the model."""


class DispatchedModelError(AccelCkptError, RuntimeError):
    """An operation that would break a dispatched (hooked, offloaded) model, such as ``.to()``."""


def format_keys(keys: Iterable[str], limit: int = 10) -> str:
    """Render a key list for an error message, shortened after ``limit`` entries."""
    ordered = sorted(keys)
    shown = ", ".join(repr(key) for key in ordered[:limit])
    if len(ordered) > limit:
        shown += f", ... ({len(ordered) - limit} more)"
    return f"[{shown}]"
