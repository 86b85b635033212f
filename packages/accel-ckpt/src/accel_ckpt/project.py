"""``ProjectConfiguration`` and the ``project_dir/checkpoints/checkpoint_<i>`` folder scheme."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from accel_ckpt.atomic import committed_path, remove_tree
from accel_ckpt.errors import InvalidArgumentError
from accel_ckpt.manifest import is_complete

CHECKPOINTS_FOLDER = "checkpoints"
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")


@dataclass
class ProjectConfiguration:
    """Where and how checkpoints of a project are saved (Accelerate's ``ProjectConfiguration``).

    Attributes:
        project_dir: Folder of the project; checkpoints go to ``project_dir/checkpoints``.
        logging_dir: Folder for logs; defaults to ``project_dir``.
        automatic_checkpoint_naming: Name checkpoints ``checkpoint_<iteration>`` automatically.
        total_limit: Keep at most this many automatically named checkpoints (oldest removed
            after a new one is committed).
        iteration: Number of the next automatically named checkpoint.
        save_on_each_node: Each machine's local main process writes (file systems not shared).

    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise InvalidArgumentError(
                f"ProjectConfiguration(total_limit={self.total_limit}) must be at least 1, or "
                "None to keep every checkpoint."
            )

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Set ``project_dir`` and, when it was unset, ``logging_dir``."""
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    @property
    def checkpoints_dir(self) -> Path:
        """``project_dir/checkpoints``."""
        if self.project_dir is None:
            raise InvalidArgumentError(
                "automatic_checkpoint_naming=True needs ProjectConfiguration(project_dir=...)."
            )
        return Path(self.project_dir) / CHECKPOINTS_FOLDER

    def checkpoint_dir(self, iteration: int | None = None) -> Path:
        """``project_dir/checkpoints/checkpoint_<iteration>`` (default: :attr:`iteration`)."""
        number = self.iteration if iteration is None else iteration
        return self.checkpoints_dir / f"checkpoint_{number}"


def checkpoint_number(path: str | os.PathLike[str]) -> int | None:
    """``7`` for ``.../checkpoint_7``, else ``None``."""
    match = _CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def numbered_checkpoints(folder: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Every ``checkpoint_<i>`` folder in ``folder``, oldest (lowest number) first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        number = checkpoint_number(entry)
        if number is not None and entry.is_dir():
            found.append((number, entry))
    return sorted(found)


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The highest-numbered complete checkpoint in ``folder`` (incomplete ones are skipped)."""
    root = Path(folder)
    numbers = {n for n, _ in numbered_checkpoints(root)}
    if root.is_dir():
        # A checkpoint replaced in place may be waiting under a hidden name (see atomic.py).
        for entry in root.iterdir():
            match = re.match(r"^\.(checkpoint_\d+)\.accel-old-", entry.name)
            if match and (number := checkpoint_number(match.group(1))) is not None:
                numbers.add(number)
    for number in sorted(numbers, reverse=True):
        found = committed_path(root / f"checkpoint_{number}", is_complete)
        if found is not None:
            return found
    return None


def apply_total_limit(folder: str | os.PathLike[str], total_limit: int, keep: Path) -> list[Path]:
    """Delete the oldest ``checkpoint_<i>`` folders beyond ``total_limit``; never ``keep``.

    Returns:
        The folders deleted.

    """
    existing = [path for _, path in numbered_checkpoints(folder)]
    excess = len(existing) - total_limit
    removed = []
    for path in existing:
        if excess <= 0:
            break
        if path.resolve() == keep.resolve():
            continue
        remove_tree(path)
        removed.append(path)
        excess -= 1
    return removed
