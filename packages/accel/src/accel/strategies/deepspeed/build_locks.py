"""Build locks of torch C++ extensions that no process holds: a compile killed midway left them.

torch compiles an extension (DeepSpeed's ops on first use) under a ``lock`` file in its build
folder and removes the file when done; every other process waits, with no time limit, for the
file to disappear. A compile that was killed (a job stopped by a timeout, Ctrl-C during the first
run) leaves the file behind, and every later job that needs the op waits forever without a word.

The builder keeps the lock file open while it compiles, so on Linux a lock that no process on
this machine has open is stale. Run ``python -m accel.utils.build_locks`` to list them and
``--remove`` to delete them (on a build folder shared between machines, make sure no other
machine is compiling first).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger("accel.utils.build_locks")


def extensions_root() -> Path:
    """Where torch builds C++ extensions: ``$TORCH_EXTENSIONS_DIR`` or torch's default root."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return Path(configured)
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def _open_files() -> set[str] | None:
    """Every file some process on this machine has open (``None`` where /proc cannot tell)."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    opened: set[str] = set()
    for fd_folder in proc.glob("[0-9]*/fd"):
        try:
            entries = list(fd_folder.iterdir())
        except OSError:  # the process ended, or it is not ours to read
            continue
        for entry in entries:
            try:
                opened.add(os.readlink(entry))
            except OSError:
                continue
    return opened


def stale_build_locks(root: Path | None = None) -> list[Path]:
    """The extension build locks under ``root`` that no process on this machine has open.

    Args:
        root: The extensions folder; :func:`extensions_root` when omitted.

    Returns:
        The stale lock files (empty where the platform cannot tell which files are open).
    """
    root = extensions_root() if root is None else root
    locks = sorted({*root.glob("*/lock"), *root.glob("*/*/lock")})
    if not locks:
        return []
    opened = _open_files()
    if opened is None:
        return []
    return [lock for lock in locks if str(lock.resolve()) not in opened]


def warn_about_stale_build_locks(root: Path | None = None) -> list[Path]:
    """Log a warning for each stale build lock (a job needing that op would wait forever).

    Returns:
        The stale locks found.
    """
    stale = stale_build_locks(root)
    for lock in stale:
        logger.warning(
            f"{lock} is a torch extension build lock that no process on this machine holds: a "
            f"compile of {lock.parent.name!r} was killed midway, and any process that needs this "
            "op will wait for the lock forever. Unless another machine sharing this folder is "
            f"compiling it right now, delete it: rm {lock} (or python -m accel.utils.build_locks "
            "--remove)."
        )
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """List (and with ``--remove``, delete) stale build locks; exit 1 when some were left."""
    parser = argparse.ArgumentParser(prog="python -m accel.utils.build_locks", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="extensions folder to check")
    parser.add_argument("--remove", action="store_true", help="delete the stale locks")
    args = parser.parse_args(argv)
    stale = stale_build_locks(args.root)
    for lock in stale:
        if args.remove:
            lock.unlink(missing_ok=True)
            print(f"removed stale build lock {lock}")
        else:
            print(f"stale build lock {lock}")
    return 1 if stale and not args.remove else 0


if __name__ == "__main__":
    sys.exit(main())
