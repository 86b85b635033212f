"""Asynchronous saves: snapshot tensors into host memory, write and commit on a background thread.

``save_state(..., blocking=False)`` returns an :class:`AsyncSave` once every tensor is copied into
a reusable host staging buffer (pinned when copying from CUDA); the caller may then keep
training. Files are written, fsynced and committed on a thread. The next ``save_state`` or
``load_state``, :func:`wait_for_pending_saves` or ``AsyncSave.wait()`` joins it and raises
:class:`AsyncSaveError` if it failed. Interpreter exit waits for it too.

Sharded states that stage themselves (:class:`accel_ckpt.StageableShardedState`, FSDP's through
``torch.distributed.checkpoint``) copy their shards into host memory of their own before the call
returns; the background thread then writes them over the checkpoint's gloo group (never the
training loop's), writes the other files, and publishes the folder atomically. A crash before the
publish leaves only a hidden temporary folder: the previous checkpoint stays the newest.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from accel_ckpt.errors import AsyncSaveError
from accel_ckpt.file_jobs import FileJob
from accel_ckpt.memory import snapshot_into

logger = logging.getLogger(__name__)

_ALIGN = 64
_LOCK = threading.Lock()
_PENDING: list[AsyncSave] = []


class StagingArena:
    """One host buffer that snapshots are copied into, kept between saves to avoid page faults."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def _reserve(self, nbytes: int, pinned: bool) -> torch.Tensor:
        buffer = self._buffer
        if buffer is None or buffer.numel() < nbytes or buffer.is_pinned() != pinned:
            self._buffer = None  # free the old one first
            buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pinned)
            self._buffer = buffer
        return buffer

    def snapshot(self, jobs: Iterable[FileJob]) -> None:
        """Replace every job's tensors by copies in the staging buffer (pickles by their bytes)."""
        jobs = list(jobs)
        tensors = [t for job in jobs for t in job.tensors.values()]
        on_cuda = any(t.device.type == "cuda" for t in tensors)
        pinned = on_cuda and torch.cuda.is_available()
        total = sum(_padded(t.numel() * t.element_size()) for t in tensors)
        buffer = self._reserve(total, pinned)
        offset = 0
        for job in jobs:
            job.serialise_pickle()
            copies = {}
            for name, tensor in job.tensors.items():
                nbytes = tensor.numel() * tensor.element_size()
                view = buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
                offset += _padded(nbytes)
                snapshot_into(view, tensor.detach())
                copies[name] = view
            job.tensors = copies
        if pinned:
            torch.cuda.synchronize()

    def release(self) -> None:
        """Free the staging buffer (the next asynchronous save allocates a new one)."""
        self._buffer = None


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


ARENA = StagingArena()


_RELEASERS: list[Callable[[], None]] = []


def register_staging_release(release: Callable[[], None]) -> None:
    """Have :func:`release_staging_memory` also call ``release`` (a sharded state's own buffers)."""
    if release not in _RELEASERS:
        _RELEASERS.append(release)


def release_staging_memory() -> None:
    """Free the host memory kept for asynchronous saves (after joining pending ones)."""
    wait_for_pending_saves()
    ARENA.release()
    for release in _RELEASERS:
        release()


class AsyncSave:
    """Handle of a checkpoint being written in the background.

    Attributes:
        path: The folder the checkpoint is committed to.

    """

    def __init__(self, path: Path, work: Callable[[], Path]) -> None:
        self.path = path
        self._result: Path | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(work,), name=f"accel-ckpt save {path.name}", daemon=False
        )
        with _LOCK:
            _PENDING.append(self)
        self._thread.start()

    def _run(self, work: Callable[[], Path]) -> None:
        try:
            self._result = work()
        except BaseException as error:  # noqa: BLE001 - surfaced by wait()
            self._error = error
            logger.error("Background save of %s failed: %s", self.path, error)

    def done(self) -> bool:
        """Whether the background work has finished (successfully or not)."""
        return not self._thread.is_alive()

    def exception(self) -> BaseException | None:
        """The error the background work raised, once done."""
        return self._error

    def wait(self, timeout: float | None = None) -> Path:
        """Block until committed and return the checkpoint folder.

        Raises:
            AsyncSaveError: The save failed (its cause is attached); nothing was committed.
            TimeoutError: Still running after ``timeout`` seconds.

        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"The save of {self.path} is still running after {timeout} s.")
        with _LOCK:
            if self in _PENDING:
                _PENDING.remove(self)
        if self._error is not None:
            raise AsyncSaveError(
                f"Background save of {self.path} failed: {type(self._error).__name__}: "
                f"{self._error}. The previous checkpoint is untouched; fix the cause and save again."
            ) from self._error
        assert self._result is not None
        return self._result

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "committed")
        return f"AsyncSave(path={str(self.path)!r}, {state})"


def wait_for_pending_saves() -> None:
    """Join every background save of this process, raising the first failure."""
    with _LOCK:
        pending = list(_PENDING)
    first: AsyncSaveError | None = None
    for handle in pending:
        try:
            handle.wait()
        except AsyncSaveError as error:
            first = first or error
    if first is not None:
        raise first
