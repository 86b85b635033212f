"""A checkpoint never reaches outside its folder: every name it holds must resolve inside it.

Checkpoints are shared and downloaded. A manifest, a shard index, an offload index or a sharded
state's metadata that names ``../../weights.safetensors``, ``/etc/passwd`` or a symlink pointing
elsewhere would make loading read (or saving write) a file outside the folder. Every such name
goes through :func:`resolve_inside` before it is opened: it must be relative, without ``..``, and
its real path (symlinks followed) must lie inside the real path of the folder; otherwise the
load or save is refused with :class:`~accel_ckpt.errors.PathEscapeError` naming the entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath

from accel_ckpt.errors import PathEscapeError

PathLike = str | os.PathLike[str]


def check_relative_name(name: object, source: str) -> str:
    """``name`` as a relative path that stays inside its folder by its spelling alone.

    Args:
        name: The entry, as read from a file or given by a user.
        source: Where it comes from, for the error (``"accel_manifest.json of ckpt/"``).

    Raises:
        PathEscapeError: Not a non-empty string, absolute (POSIX or Windows), or with ``..``.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise PathEscapeError(f"{source} holds the entry {name!r}, which is not a file name.")
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or name.startswith("\\"):
        raise PathEscapeError(
            f"{source} names {name!r}, an absolute path; a checkpoint may only name files "
            "inside its own folder. Refused."
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise PathEscapeError(
            f"{source} names {name!r}, which climbs out of the folder with '..'; a checkpoint "
            "may only name files inside its own folder. Refused."
        )
    return name


def resolve_inside(folder: PathLike, name: object, source: str) -> Path:
    """``folder / name``, refused unless it resolves inside ``folder`` (symlinks followed).

    Args:
        folder: The checkpoint (or index, or offload) folder.
        name: The entry naming a file in it.
        source: Where the entry comes from, for the error.

    Returns:
        The path ``folder / name`` (not resolved: the caller opens it as named).

    Raises:
        PathEscapeError: The name is absolute, climbs with ``..``, or resolves outside
            ``folder`` through a symlink.
    """
    relative = check_relative_name(name, source)
    path = Path(folder) / relative
    root = os.path.realpath(folder)
    real = os.path.realpath(path)
    if real != root and not real.startswith(os.path.join(root, "")):
        raise PathEscapeError(
            f"{source} names {relative!r}, which is a symlink (or lies under one) resolving to "
            f"{real}, outside {root}; a checkpoint may only name files inside its own folder. "
            "Refusing to load it; replace the link with the file itself if you trust it."
        )
    return path


def check_all_inside(folder: PathLike, names: Iterable[object], source: str) -> None:
    """:func:`resolve_inside` for every name (refuses at the first that escapes)."""
    for name in names:
        resolve_inside(folder, name, source)


def check_tree_inside(folder: PathLike, source: str) -> None:
    """Refuse a folder (being saved) that holds a symlink resolving outside it.

    Raises:
        PathEscapeError: Naming the link.
    """
    root = Path(folder)
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            resolve_inside(root, path.relative_to(root).as_posix(), source)


def check_dcp_paths(folder: PathLike) -> None:
    """Refuse a ``torch.distributed.checkpoint`` folder whose metadata names files outside it.

    Raises:
        PathEscapeError: An entry of its ``.metadata`` resolves outside ``folder``.
    """
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    metadata = FileSystemReader(os.fspath(folder)).read_metadata()
    storage = getattr(metadata, "storage_data", None) or {}
    names = {getattr(info, "relative_path", None) for info in storage.values()}
    check_all_inside(folder, sorted(names, key=str), f".metadata of {os.fspath(folder)}")
