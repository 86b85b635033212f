"""The manifest that marks a checkpoint folder complete: every file's size and CRC-32.

``accel_manifest.json`` is written last, after every process's files are on stable storage; a
folder without it, or whose files disagree with it, is never loaded.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_ckpt.atomic import atomic_file
from accel_ckpt.checksum import FileRecord, verify_file
from accel_ckpt.containment import resolve_inside
from accel_ckpt.errors import CorruptCheckpointError, IncompleteCheckpointError

MANIFEST_NAME = "accel_manifest.json"
FORMAT_NAME = "accel-ckpt"
FORMAT_VERSION = 1


@dataclass
class Manifest:
    """What a committed checkpoint folder holds.

    Attributes:
        files: Relative path -> size and CRC-32, for every file in the folder but the manifest.
        contents: Which file holds what: ``{"models": [...], "optimizers": [...], ...}``.
        num_processes: How many processes saved it.
        metadata: JSON data the caller attached (``save_state(..., metadata=...)``).
        created: UTC time of the commit, ISO 8601.

    """

    files: dict[str, FileRecord]
    contents: dict[str, Any] = field(default_factory=dict)
    num_processes: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON document written to ``accel_manifest.json``."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "created": self.created or datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "num_processes": self.num_processes,
            "checksum": "crc32",
            "contents": self.contents,
            "metadata": self.metadata,
            "files": {name: record.to_json() for name, record in sorted(self.files.items())},
        }


def write_manifest(folder: str | os.PathLike[str], manifest: Manifest) -> None:
    """Write ``folder/accel_manifest.json`` durably (temporary file, fsync, rename)."""
    target = Path(folder) / MANIFEST_NAME
    with atomic_file(target) as temporary:
        temporary.write_text(json.dumps(manifest.to_json(), indent=1, allow_nan=False))


def read_manifest(folder: str | os.PathLike[str]) -> Manifest:
    """Parse ``folder/accel_manifest.json``.

    Raises:
        IncompleteCheckpointError: There is no manifest: the save never finished.
        CorruptCheckpointError: The manifest is unreadable.

    """
    path = Path(folder) / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise IncompleteCheckpointError(
            f"{folder} is not a complete checkpoint: {MANIFEST_NAME} is missing, so the save "
            "that wrote it never finished. Load an earlier checkpoint (load_state() without a "
            "path picks the newest complete one) or save again."
        ) from None
    try:
        document = json.loads(text)
        if document.get("format") != FORMAT_NAME:
            raise ValueError(f"format is {document.get('format')!r}, not {FORMAT_NAME!r}")
        if int(document.get("version", 0)) > FORMAT_VERSION:
            raise ValueError(
                f"version {document['version']} is newer than this accel-ckpt understands "
                f"({FORMAT_VERSION}); upgrade accel-ckpt"
            )
        files = {name: FileRecord.from_json(entry) for name, entry in document["files"].items()}
        return Manifest(
            files=files,
            contents=dict(document.get("contents", {})),
            num_processes=int(document.get("num_processes", 1)),
            metadata=dict(document.get("metadata", {})),
            created=str(document.get("created", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptCheckpointError(f"{path} is unreadable: {error}.") from None


def verify_sizes(folder: str | os.PathLike[str], manifest: Manifest) -> None:
    """Check that every file the manifest lists exists with its recorded size.

    Raises:
        IncompleteCheckpointError: A listed file is missing.
        CorruptCheckpointError: A listed file has another size.
        PathEscapeError: A listed name resolves outside ``folder``.

    """
    source = f"{MANIFEST_NAME} of {os.fspath(folder)}"
    for name, record in manifest.files.items():
        path = resolve_inside(folder, name, source)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IncompleteCheckpointError(
                f"{path} is missing from checkpoint {folder} although its manifest lists it; "
                "the folder was modified after saving. Restore the file or load another checkpoint."
            ) from None
        if size != record.size:
            raise CorruptCheckpointError(
                f"{path} is {size} bytes but checkpoint {folder} recorded {record.size} bytes; "
                "the file was truncated or replaced. Load another checkpoint."
            )


def verify_checkpoint(folder: str | os.PathLike[str]) -> Manifest:
    """Read every file of a committed checkpoint and check its size and CRC-32.

    ``load_state`` checks the files it reads itself while reading them; the files of sharded
    states (``torch.distributed.checkpoint`` shards, DeepSpeed engine files) are read by their
    own libraries, which check nothing, so ``load_state`` only checks their sizes. Call this
    after copying or restoring a checkpoint to check every byte.

    Returns:
        The checkpoint's manifest.

    Raises:
        IncompleteCheckpointError: No manifest, or a listed file is missing.
        CorruptCheckpointError: A listed file has another size or checksum.
    """
    manifest = read_manifest(folder)
    verify_sizes(folder, manifest)
    for name, record in sorted(manifest.files.items()):
        verify_file(os.fspath(Path(folder) / name), record)
    return manifest


def is_complete(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a manifest whose files all exist with their recorded sizes."""
    try:
        verify_sizes(folder, read_manifest(folder))
    except (IncompleteCheckpointError, OSError):
        return False
    return True
