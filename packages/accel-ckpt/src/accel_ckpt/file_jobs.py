"""One file of a checkpoint, ready to be written: tensors plus metadata, or an object to pickle."""

from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from accel_ckpt.checksum import FileRecord
from accel_ckpt.pickle_io import require_plain_tensors, save_pickled
from accel_ckpt.safetensors_io import write_safetensors


@dataclass
class FileJob:
    """A file to write into a checkpoint folder.

    Attributes:
        relpath: Path inside the checkpoint folder.
        category: ``models``, ``optimizers``, ``schedulers``, ``dataloaders``, ``scaler``,
            ``custom_objects`` or ``random_states``.
        index: Position of the object in its list.
        tensors: Tensors of a safetensors file.
        metadata: ``__metadata__`` of a safetensors file.
        pickled: Object for ``torch.save`` instead (``.bin`` weights, ``allow_pickle`` objects).
        pickled_bytes: ``pickled`` already serialised (taken by an asynchronous save's snapshot).

    """

    relpath: str
    category: str
    index: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    pickled: Any = None
    pickled_bytes: bytes | None = None

    @property
    def is_pickle(self) -> bool:
        """Whether the file is a ``torch.save`` file."""
        return self.pickled is not None or self.pickled_bytes is not None

    def nbytes(self) -> int:
        """Tensor bytes this job holds."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def write(self, folder: Path) -> FileRecord:
        """Write (and fsync) the file into ``folder``."""
        path = folder / self.relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.pickled_bytes is not None:
            return _write_bytes(path, self.pickled_bytes)
        if self.pickled is not None:
            return save_pickled(self.pickled, path)
        return write_safetensors(path, self.tensors, self.metadata)

    def serialise_pickle(self) -> None:
        """Replace ``pickled`` by its bytes, so later changes to the object are not saved."""
        if self.pickled is not None:
            require_plain_tensors(self.pickled, self.relpath)
            buffer = io.BytesIO()
            torch.save(self.pickled, buffer)
            self.pickled_bytes = buffer.getvalue()
            self.pickled = None


def _write_bytes(path: Path, data: bytes) -> FileRecord:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileRecord(len(data), zlib.crc32(data))
