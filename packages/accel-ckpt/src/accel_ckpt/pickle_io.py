"""The only places pickle is used: ``torch.save`` files, loaded with ``weights_only=True``.

Loading goes through PyTorch's restricted unpickler, which only rebuilds tensors, plain
containers and the classes in :func:`allowed_globals` (plus what the caller adds). A file that
needs anything else raises :class:`UnsafeCheckpointError` *before* any of its code runs; only
``allow_pickle=True`` (trusting the file) uses the full unpickler.
"""

from __future__ import annotations

import codecs
import collections
import io
import os
import pickle
import zlib
from collections.abc import Mapping, Sequence
from typing import IO, Any, cast

import torch

from accel_ckpt.checksum import FileRecord, verify_file
from accel_ckpt.errors import CorruptCheckpointError, UnsafeCheckpointError
from accel_ckpt.memory import require_plain_tensor
from accel_state.torch_compat import safe_globals as torch_safe_globals

PathLike = str | os.PathLike[str]


def allowed_globals() -> list[Any]:
    """The explicit allow-list added to PyTorch's own for ``weights_only`` loading.

    ``OrderedDict`` and ``torch.Size`` (state dicts), and numpy's array and dtype reconstruction
    when numpy is installed (``save()`` of dicts holding numeric numpy arrays).
    """
    allowed: list[Any] = [collections.OrderedDict, torch.Size]
    try:
        import numpy as np
    except ImportError:
        return allowed
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    multiarray = getattr(core, "multiarray", None)
    for name in ("_reconstruct", "scalar"):
        function = getattr(multiarray, name, None)
        if function is not None:
            allowed.append(function)
    allowed += [np.ndarray, np.dtype]
    for kind in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                 np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128):  # fmt: skip
        allowed.append(type(np.dtype(kind)))
    return allowed


#: Accelerate's list of globals that ``torch.load(weights_only=True)`` may rebuild for its
#: checkpoints: :func:`allowed_globals` (numpy arrays and dtypes) plus ``codecs.encode`` (numpy's
#: pickled RNG states use it). Use with ``torch.serialization.safe_globals(TORCH_SAFE_GLOBALS)``.
TORCH_SAFE_GLOBALS: list[Any] = [*allowed_globals(), codecs.encode]


class _RecordingWriter(io.RawIOBase):
    """A write-only file over ``fd`` that counts bytes and computes their CRC-32."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.size = 0
        self.crc = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            written += os.write(self.fd, view[written:])
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        return len(view)


def require_plain_tensors(obj: Any, where: str) -> None:
    """Refuse a ``DTensor``, meta, sparse or other non-plain tensor anywhere in nested containers.

    Walks dicts, lists, tuples and sets (what state dicts are made of) and checks every tensor
    with :func:`accel_ckpt.memory.require_plain_tensor`, naming its path inside ``obj``.

    Raises:
        InvalidArgumentError: A tensor in ``obj`` is not a plain dense tensor.
    """
    pending: list[tuple[Any, str]] = [(obj, where)]
    while pending:
        value, path = pending.pop()
        if isinstance(value, torch.Tensor):
            require_plain_tensor(value, path)
        elif isinstance(value, Mapping):
            pending.extend((item, f"{path}.{key}") for key, item in value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending.extend((item, f"{path}.{index}") for index, item in enumerate(value))


def save_pickled(obj: Any, path: PathLike, *, durable: bool = True) -> FileRecord:
    """``torch.save(obj)`` to ``path`` (replacing it), fsynced when ``durable``.

    Raises:
        InvalidArgumentError: ``obj`` holds a tensor that is not a plain dense tensor (see
            :func:`require_plain_tensors`); nothing is written then.
    """
    require_plain_tensors(obj, os.path.basename(os.fspath(path)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        writer = _RecordingWriter(fd)
        torch.save(obj, cast(IO[bytes], writer))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return FileRecord(writer.size, writer.crc)


def _reason(error: BaseException) -> str:
    for line in str(error).splitlines():
        if "GLOBAL" in line or "Unsupported" in line:
            return line.strip()
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def load_pickled(
    path: PathLike,
    *,
    allow_pickle: bool = False,
    map_location: Any = "cpu",
    safe_globals: Sequence[Any] = (),
    expected: FileRecord | None = None,
    mmap: bool = False,
) -> Any:
    """Load a ``torch.save`` file without running code from it (unless ``allow_pickle``).

    Args:
        path: The file.
        allow_pickle: Use the full unpickler: the file may run arbitrary code. Only for trusted
            files.
        map_location: As for ``torch.load``.
        safe_globals: Extra classes or functions the restricted unpickler may use.
        expected: Size and CRC-32 from a manifest, checked before unpickling.
        mmap: Map the file instead of reading it (``torch.load(mmap=True)``).

    Raises:
        UnsafeCheckpointError: The file needs globals outside the allow-list.
        CorruptCheckpointError: The file is damaged or has the wrong size or checksum.

    """
    name = os.fspath(path)
    if expected is not None:
        verify_file(name, expected)
    if allow_pickle:
        return torch.load(name, map_location=map_location, weights_only=False, mmap=mmap)
    try:
        with torch_safe_globals([*allowed_globals(), *safe_globals]):
            return torch.load(name, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"{name} needs code outside the safe allow-list to load ({_reason(error)}); it was "
            "not run. If you made this file and trust it, pass allow_pickle=True; to allow "
            "specific classes, pass safe_globals=[...]."
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise CorruptCheckpointError(
            f"{name} is not a readable torch.save file ({_reason(error)}); it is damaged or in "
            "another format."
        ) from None
