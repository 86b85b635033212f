"""Large-file writes that bypass the page cache (``O_DIRECT``), pipelined with the CRC-32.

Buffered writes first copy every byte into the page cache and then wait for writeback; on a busy
machine that copy competes for memory bandwidth and dirty-page throttling makes it erratic. Here
the bytes are copied into one of two page-aligned bounce buffers while the other is written by a
helper thread straight to the device and hashed by a second one. The unaligned tail is written
after clearing ``O_DIRECT``. Where ``O_DIRECT`` is unsupported (tmpfs, some network file systems,
non-Linux) the same code writes through the page cache.
"""

from __future__ import annotations

import errno
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from accel_ckpt.checksum import Crc32, FileRecord
from accel_ckpt.memory import address_of, copy_from_tensor

#: Size of each bounce buffer (two per writer); a multiple of every block size in use.
BUFFER_SIZE = 16 * 1024 * 1024
_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectFileWriter:
    """Sequentially write tensors and bytes to a new file, fsync it and report size and CRC-32.

    Args:
        path: File to create (truncated if it exists).
        buffer_size: Size of each of the two bounce buffers (default :data:`BUFFER_SIZE`).

    """

    def __init__(self, path: str | os.PathLike[str], buffer_size: int | None = None) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.direct = bool(_O_DIRECT)
        try:
            self.fd = os.open(path, flags | _O_DIRECT, 0o644)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            self.direct = False
            self.fd = os.open(path, flags, 0o644)
        self.buffer_size = buffer_size or BUFFER_SIZE
        self._buffers = [mmap.mmap(-1, self.buffer_size) for _ in range(2)]
        self._addresses = [address_of(b) for b in self._buffers]
        self._pending: list[list[Future[None] | None]] = [[], []]
        self._current = 0
        self._fill = 0
        self.size = 0
        self._checksum = Crc32()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accel-write")

    def _write(self, data: memoryview) -> None:
        written = 0
        while written < len(data):
            try:
                count = os.write(self.fd, data[written:])
            except OSError as error:
                if not self.direct or error.errno != errno.EINVAL:
                    raise
                self._buffered()  # this file system wants other alignment: write normally
                continue
            written += count
            if count % _ALIGN and written < len(data):
                self._buffered()  # a short write leaves the offset unaligned

    def _buffered(self) -> None:
        if self.direct:
            import fcntl  # only reached where O_DIRECT exists, i.e. on Linux

            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~_O_DIRECT)
            self.direct = False

    def _submit(self, final: bool = False) -> None:
        index, fill = self._current, self._fill
        view = memoryview(self._buffers[index])[:fill]
        crc = self._checksum.feed(view)
        aligned = fill - fill % _ALIGN if final else fill
        jobs: list[Future[None] | None] = [crc]
        if aligned:
            jobs.append(self._executor.submit(self._write, view[:aligned]))
        if aligned < fill:
            jobs.append(self._executor.submit(self._write_tail, view[aligned:]))
        self._pending[index] = jobs
        self.size += fill
        self._current, self._fill = index ^ 1, 0
        self._wait(self._current)

    def _write_tail(self, data: memoryview) -> None:
        self._buffered()
        self._write(data)

    def _wait(self, index: int) -> None:
        for job in self._pending[index]:
            if job is not None:
                job.result()
        self._pending[index] = []

    def write_tensor(self, tensor: torch.Tensor) -> None:
        """Append the bytes of a contiguous CPU tensor."""
        position, total = 0, tensor.numel() * tensor.element_size()
        while position < total:
            take = min(self.buffer_size - self._fill, total - position)
            copy_from_tensor(self._addresses[self._current] + self._fill, tensor, position, take)
            self._fill += take
            position += take
            if self._fill == self.buffer_size:
                self._submit()

    def write_bytes(self, data: bytes) -> None:
        """Append raw bytes."""
        if data:
            self.write_tensor(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def close(self, durable: bool = True) -> FileRecord:
        """Write what is buffered, fsync (when ``durable``), close; return size and CRC-32."""
        try:
            if self._fill:
                self._submit(final=True)
            self._wait(0)
            self._wait(1)
            if durable:
                os.fsync(self.fd)
            return FileRecord(self.size, self._checksum.value())
        finally:
            self.abort()

    def abort(self) -> None:
        """Release the file and threads without finishing (after an error)."""
        self._executor.shutdown(wait=True)
        self._checksum.value()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
