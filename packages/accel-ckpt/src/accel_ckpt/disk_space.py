"""A full disk during ``save_state``: say so up front when possible, and clearly when not.

Before writing, the process that creates the checkpoint compares the bytes every process plans to
write there (tensor bytes; sharded states and pickles are not known in advance) with the free
space of the file system. A write that still fails for lack of space (``ENOSPC``, a quota's
``EDQUOT``, or ``EFBIG`` under a file-size limit) becomes a
:class:`~accel_ckpt.errors.CheckpointDiskFullError` naming the folder and the bytes needed; the
save protocol then removes the staging folder, so the previous checkpoint stays the newest.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from accel_ckpt.errors import CheckpointDiskFullError

#: The errors that mean "no room for this file".
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def free_bytes(folder: Path) -> int | None:
    """Free bytes of the file system holding ``folder`` (None when it cannot be told)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _size(number: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if number >= scale:
            return f"{number / scale:.1f} {unit} ({number} bytes)"
    return f"{number} bytes"


def check_free_space(final: Path, staging: Path, needed: int) -> None:
    """Refuse to start writing ``needed`` bytes into ``staging`` when the disk cannot hold them.

    Raises:
        CheckpointDiskFullError: Fewer free bytes than ``needed``.
    """
    free = free_bytes(staging)
    if free is None or free >= needed:
        return
    raise CheckpointDiskFullError(
        errno.ENOSPC,
        f"Not saving checkpoint {final}: it needs at least {_size(needed)} but the file system "
        f"of {staging.parent} has {_size(free)} free. Nothing was written; the previous "
        "checkpoint stays the newest. Free some space (ProjectConfiguration(total_limit=...) "
        "keeps fewer checkpoints) or save elsewhere.",
    )


@contextlib.contextmanager
def explain_disk_full(
    final: Path, staging: Path | None, needed: int, rank: int, file: Path | None = None
) -> Iterator[None]:
    """Turn an out-of-space ``OSError`` raised in the block into a :class:`CheckpointDiskFullError`.

    Args:
        final: The checkpoint folder being saved.
        staging: Its temporary folder.
        needed: Bytes this process had to write.
        rank: This process's rank.
        file: The file being written, when the block writes one.
    """
    try:
        yield
    except OSError as error:
        if error.errno not in NO_SPACE or isinstance(error, CheckpointDiskFullError):
            raise
        where = staging if staging is not None else final.parent
        free = free_bytes(where if where.exists() else final.parent)
        what = error.filename or file or where
        limit = " (the file-size limit, RLIMIT_FSIZE)" if error.errno == errno.EFBIG else ""
        raise CheckpointDiskFullError(
            error.errno,
            f"Checkpoint {final} was not saved: writing {os.fspath(what)} failed on rank {rank} "
            f"with {os.strerror(error.errno)}{limit}. This process had {_size(needed)} to write "
            f"into {where}; "
            + (f"{_size(free)} are free now. " if free is not None else "")
            + "The staging folder is removed and the previous checkpoint stays the newest. "
            "Free some space (ProjectConfiguration(total_limit=...) keeps fewer checkpoints) or "
            "save elsewhere.",
        ) from error
