"""Durable, all-or-nothing file and folder replacement on POSIX file systems.

A file is written under a hidden temporary name in its destination folder, fsynced, renamed over
the destination, and the folder is fsynced. A checkpoint folder is assembled in a hidden sibling
``.<name>.accel-tmp-<token>`` and published by one rename; replacing an existing folder swaps the
two atomically with ``renameat2(RENAME_EXCHANGE)`` on Linux, or elsewhere renames the old one to
``.<name>.accel-old-<token>`` first (:func:`committed_path` and :func:`recover` bring it back if
the process dies between the two renames). Folders are deleted by renaming them to
``.<name>.accel-trash-<token>`` first, so a half-deleted folder never keeps its public name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

TMP_TAG = "accel-tmp"
OLD_TAG = "accel-old"
TRASH_TAG = "accel-trash"

PathLike = str | os.PathLike[str]


def new_token() -> str:
    """A short random token for temporary names."""
    return secrets.token_hex(4)


def sibling(path: PathLike, tag: str, token: str) -> Path:
    """The hidden sibling ``.<name>.<tag>-<token>`` of ``path``."""
    target = Path(path)
    return target.parent / f".{target.name}.{tag}-{token}"


def fsync_file(path: PathLike) -> None:
    """Flush a file's data and metadata to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: PathLike) -> None:
    """Flush a folder's entries (new, renamed or removed names) to stable storage."""
    if sys.platform == "win32":  # pragma: no cover - folders cannot be opened there
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` durably.

    The caller writes (and fsyncs, or lets :func:`atomic_file` do it) the temporary file. On an
    exception the temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    temporary = sibling(target, TMP_TAG, new_token())
    try:
        yield temporary
        fsync_file(temporary)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_dir(target.parent)


def _renameat2_exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically; ``False`` where the kernel or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = function(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(first), None, os.fspath(second))


def publish_dir(staged: PathLike, final: PathLike) -> None:
    """Make the fully written folder ``staged`` appear as ``final`` in one step.

    An existing ``final`` is swapped out and deleted afterwards; at every instant ``final`` is
    either the old complete folder or the new one (or, without ``renameat2``, briefly absent with
    the old one kept as ``.<name>.accel-old-*``).
    """
    staged, final = Path(staged), Path(final)
    fsync_dir(staged)
    if not final.exists():
        os.rename(staged, final)
        fsync_dir(final.parent)
        return
    if _renameat2_exchange(staged, final):
        # ``staged`` now names the previous checkpoint; hide it before deleting it.
        old = sibling(final, OLD_TAG, new_token())
        os.rename(staged, old)
        fsync_dir(final.parent)
        remove_tree(old)
        return
    old = sibling(final, OLD_TAG, new_token())
    os.rename(final, old)
    os.rename(staged, final)
    fsync_dir(final.parent)
    remove_tree(old)


def remove_tree(path: PathLike) -> None:
    """Delete a folder so that it never lingers half-deleted under its own name."""
    target = Path(path)
    if not target.exists():
        return
    if not target.name.startswith("."):
        trash = sibling(target, TRASH_TAG, new_token())
        os.rename(target, trash)
        fsync_dir(target.parent)
        target = trash
    shutil.rmtree(target, ignore_errors=True)


def _hidden_siblings(final: Path, tag: str) -> list[Path]:
    prefix = f".{final.name}.{tag}-"
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir() if p.name.startswith(prefix))


def committed_path(final: PathLike, is_complete: Callable[[Path], bool]) -> Path | None:
    """The complete folder that ``final`` stands for, without changing anything on disk.

    That is ``final`` itself, or, if a process died between the two renames of a replacement
    (platforms without ``renameat2``), the previous folder still waiting as ``.<name>.accel-old-*``.
    """
    target = Path(final)
    if target.is_dir():
        return target if is_complete(target) else None
    for old in _hidden_siblings(target, OLD_TAG):
        if is_complete(old):
            return old
    return None


def recover(final: PathLike, is_complete: Callable[[Path], bool]) -> None:
    """Tidy what an interrupted save left next to ``final`` (call on one process only).

    Restores an orphaned previous folder (see :func:`committed_path`) and deletes stale
    temporary, old and trash siblings.
    """
    target = Path(final)
    if not target.exists():
        for old in _hidden_siblings(target, OLD_TAG):
            if is_complete(old):
                os.rename(old, target)
                fsync_dir(target.parent)
                break
    for tag in (TMP_TAG, OLD_TAG, TRASH_TAG):
        for leftover in _hidden_siblings(target, tag):
            shutil.rmtree(leftover, ignore_errors=True)
