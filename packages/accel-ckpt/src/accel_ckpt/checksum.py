"""CRC-32 checksums computed on a helper thread while the caller reads or writes the bytes.

``zlib.crc32`` releases the GIL on large buffers, so hashing chunk *n* overlaps the ``write`` or
``readinto`` of chunk *n + 1* and costs almost no wall time next to the disk. CRC-32 detects
torn, truncated and bit-flipped files; it is not a defence against deliberate tampering.
"""

from __future__ import annotations

import zlib
from concurrent.futures import Future, ThreadPoolExecutor

from accel_ckpt.errors import CorruptCheckpointError

#: Buffers smaller than this are hashed inline; a thread hand-off would cost more than it saves.
INLINE_LIMIT = 4 * 1024 * 1024


class Crc32:
    """A running CRC-32 fed with buffers in order; large buffers are hashed on a worker thread.

    The caller must not modify a buffer after feeding it until :meth:`value` returns.
    """

    def __init__(self) -> None:
        self._value = 0
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None

    def _update(self, data: memoryview | bytes) -> None:
        self._value = zlib.crc32(data, self._value)

    def feed(self, data: memoryview | bytes) -> Future[None] | None:
        """Add ``data`` to the checksum (asynchronously when it is large).

        Returns:
            A future that completes once ``data`` is hashed, or ``None`` if it already is.

        """
        if len(data) < INLINE_LIMIT and self._executor is None:
            self._update(data)
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accel-crc")
        self._last = self._executor.submit(self._update, data)
        return self._last

    def drain(self) -> None:
        """Wait until every buffer fed so far has been hashed (they may be freed afterwards)."""
        if self._last is not None:
            self._last.result()

    def value(self) -> int:
        """Wait for every fed buffer and return the checksum."""
        if self._executor is not None:
            if self._last is not None:
                self._last.result()
            self._executor.shutdown(wait=True)
            self._executor = None
            self._last = None
        return self._value


def crc32_of_file(path: str, chunk_size: int = 16 * 1024 * 1024) -> tuple[int, int]:
    """Size and CRC-32 of a file already on disk (for files written by user hooks)."""
    checksum = Crc32()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            chunk = handle.read(chunk_size)
            if not chunk:
                break
            size += len(chunk)
            checksum.feed(chunk)
    return size, checksum.value()


def verify_file(path: str, expected: FileRecord) -> None:
    """Read ``path`` whole and check its size and CRC-32 against a manifest's record.

    Raises:
        CorruptCheckpointError: They differ (the file was damaged after saving).
    """
    size, crc = crc32_of_file(path)
    if (size, crc) != (expected.size, expected.crc32):
        raise CorruptCheckpointError(
            f"{path}: size/CRC-32 {size}/{crc:08x} differ from the manifest's "
            f"{expected.size}/{expected.crc32:08x}; the file is damaged. Load another checkpoint."
        )


class FileRecord:
    """Size and CRC-32 of one written file, as stored in a checkpoint manifest."""

    __slots__ = ("crc32", "size")

    def __init__(self, size: int, crc32: int) -> None:
        self.size = size
        self.crc32 = crc32

    def to_json(self) -> dict[str, int | str]:
        """The manifest entry: ``{"size": ..., "crc32": "8 hex digits"}``."""
        return {"size": self.size, "crc32": f"{self.crc32:08x}"}

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> FileRecord:
        """Parse a manifest entry written by :meth:`to_json`."""
        size, crc = entry["size"], entry["crc32"]
        if not isinstance(size, int) or not isinstance(crc, str):
            raise ValueError(f"bad manifest entry {entry!r}")
        return cls(size, int(crc, 16))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileRecord) and (self.size, self.crc32) == (
            other.size,
            other.crc32,
        )

    def __hash__(self) -> int:
        return hash((self.size, self.crc32))

    def __repr__(self) -> str:
        return f"FileRecord(size={self.size}, crc32={self.crc32:08x})"
