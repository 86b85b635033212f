"""A ``torch.distributed.checkpoint`` writer that checksums every file while writing it.

A sharded state written through :func:`checksummed_writer` can report the size and CRC-32 of
each file its process wrote (see :class:`accel_ckpt.ShardedState`), so the committing process
does not read every rank's shards back to checksum them: each process hashes its own bytes on
the way to the disk, in parallel with the others.

While the data files are written, torch's own CRC-32 of every zip record inside them is switched
off (``torch.serialization.set_crc32_options``): ``torch.load`` never checks those (a flipped
byte loads silently), so they cost save time and protect nothing. The per-file CRC-32 in the
checkpoint manifest replaces them.

Example:
    >>> from torch.distributed.checkpoint import save
    >>> writer = checksummed_writer(folder)  # doctest: +SKIP
    >>> save(state_dict, storage_writer=writer)  # doctest: +SKIP
    >>> writer.records  # {"__0_0.distcp": (size, crc32), ".metadata": (...)}  # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.futures import Future

from accel_state.torch_compat import zip_record_checksums_off

PathLike = str | os.PathLike[str]


class _ChecksummingStream:
    """A sequential binary writer that counts and CRC-32s the bytes it passes on.

    A ``seek`` or ``truncate`` (never done by torch's writer today) makes the running checksum
    meaningless, so the stream then reports itself as ``unknown`` and its file is checksummed
    from disk instead.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.size = 0
        self.crc32 = 0
        self.unknown = False

    def write(self, data: Any) -> int:
        """Write ``data`` (any bytes-like object) and add the written bytes to the checksum."""
        view = memoryview(data).cast("B")
        written = self._raw.write(view)
        count = len(view) if written is None else written
        self.crc32 = zlib.crc32(view[:count], self.crc32)
        self.size += count
        return count

    def tell(self) -> int:
        """The position in the file (bytes written so far)."""
        return self._raw.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move in the file; the running checksum no longer describes it."""
        self.unknown = True
        return self._raw.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        """Truncate the file; the running checksum no longer describes it."""
        self.unknown = True
        return self._raw.truncate(size)

    def flush(self) -> None:
        """Flush the underlying file's buffer."""
        self._raw.flush()

    def fileno(self) -> int:
        """The underlying file descriptor (torch fsyncs it)."""
        return self._raw.fileno()

    def writable(self) -> bool:
        """Always true."""
        return True

    def seekable(self) -> bool:
        """Whether the underlying file can seek."""
        return self._raw.seekable()

    def close(self) -> None:
        """Close the underlying file."""
        self._raw.close()

    @property
    def closed(self) -> bool:
        """Whether the underlying file is closed."""
        return self._raw.closed


class _ChecksummingFileSystem(FileSystem):
    """``FileSystem`` whose written files are recorded with their size and CRC-32."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root
        self._lock = threading.Lock()
        self.records: dict[str, tuple[int, int]] = {}

    def _key(self, path: PathLike) -> str:
        return Path(path).relative_to(self._root).as_posix()

    @contextmanager
    def create_stream(self, path: PathLike, mode: str) -> Iterator[Any]:
        """Open ``path``; a file created for writing is checksummed as it is written."""
        key = self._key(path)
        if any(flag in mode for flag in "wxa+"):  # the old record no longer describes the file
            with self._lock:
                self.records.pop(key, None)
        if "w" not in mode and "x" not in mode:  # reading, appending, updating: not counted
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as raw:
            counted = _ChecksummingStream(raw)
            yield counted
        if not counted.unknown:
            with self._lock:
                self.records[key] = (counted.size, counted.crc32)

    def rename(self, path: PathLike, new_path: PathLike) -> None:
        """Rename a file and move its record with it (torch renames ``.metadata.tmp``)."""
        super().rename(path, new_path)
        with self._lock:
            record = self.records.pop(self._key(path), None)
            if record is not None:
                self.records[self._key(new_path)] = record

    def rm_file(self, path: PathLike) -> None:
        """Delete a file and forget its record."""
        super().rm_file(path)
        with self._lock:
            self.records.pop(self._key(path), None)


class ChecksummedWriter(FileSystemWriter):
    """``FileSystemWriter`` (fsyncing every file) that records what this process wrote.

    Args:
        folder: The checkpoint folder to write into.
        **options: Further ``FileSystemWriter`` options (``thread_count``, ...).

    Attributes:
        records: Path relative to ``folder`` -> ``(size, crc32)`` of every file this process
            wrote completely; filled by ``torch.distributed.checkpoint.save``.
    """

    def __init__(self, folder: PathLike, **options: Any) -> None:
        options.setdefault("sync_files", True)
        super().__init__(folder, **options)
        self._files = _ChecksummingFileSystem(Path(folder))
        self.fs = self._files

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        """Start a new save (into ``checkpoint_id`` if given): records start empty."""
        super().reset(checkpoint_id)
        self._files = _ChecksummingFileSystem(Path(self.path))
        self.fs = self._files

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[Any]:
        """Write this process's data files (torch's per-record CRC-32 off meanwhile)."""
        with _without_record_checksums():
            return super().write_data(plan, planner)

    @property
    def records(self) -> dict[str, tuple[int, int]]:
        """Files written so far by this process: relative path -> (size, CRC-32)."""
        with self._files._lock:
            return dict(self._files.records)


_CRC_OPTION_LOCK = threading.Lock()


@contextmanager
def _without_record_checksums() -> Iterator[None]:
    """Let ``torch.save`` skip the CRC-32 of its zip records, then restore the setting.

    The setting is process-wide; it is restored even if writing fails. Torch 2.4 and 2.5 have
    no such setting and always write them (``accel_state.torch_compat``).
    """
    with _CRC_OPTION_LOCK, zip_record_checksums_off():
        yield


def checksummed_writer(folder: PathLike, **options: Any) -> ChecksummedWriter:
    """A :class:`ChecksummedWriter` for ``folder`` (fsyncs every file it writes)."""
    return ChecksummedWriter(folder, **options)
