"""Read and write safetensors files directly between tensor memory and the file, with fsync.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length,
a JSON header ``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}`` padded
with spaces to a multiple of 8, then the raw little-endian bytes of every tensor, back to back.
Files written here are read by the ``safetensors`` library and vice versa.

Writing goes straight from each tensor's memory to ``os.write`` (no intermediate ``bytes``),
tensors sorted by element size so every tensor starts aligned. Reading fills either the caller's
tensors (``targets``, e.g. a model's parameters) or new tensors with sequential
``readinto`` calls; a CRC-32 of the whole file is computed on the side (:mod:`accel_ckpt.checksum`).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from accel_ckpt.checksum import Crc32, FileRecord
from accel_ckpt.direct_io import DirectFileWriter
from accel_ckpt.dtypes import safetensors_code, torch_dtype
from accel_ckpt.errors import CorruptCheckpointError
from accel_ckpt.memory import empty_released, require_plain_tensor, tensor_bytes

#: Bytes per buffered ``os.write`` call; also the unit handed to the CRC thread.
CHUNK_SIZE = 32 * 1024 * 1024
#: Bytes per ``readinto`` call: small enough that the CRC thread finds them still in the CPU cache.
READ_CHUNK_SIZE = 4 * 1024 * 1024
#: Files at least this large are written with ``O_DIRECT`` (see :mod:`accel_ckpt.direct_io`).
DIRECT_IO_MIN_BYTES = 32 * 1024 * 1024
#: The safetensors library refuses headers above this size.
MAX_HEADER_SIZE = 100 * 1024 * 1024
_KEEPALIVE_LIMIT = 256 * 1024 * 1024

if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
    raise ImportError("accel_ckpt writes little-endian safetensors files; this host is big-endian.")

PathLike = str | os.PathLike[str]


def cpu_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, on the CPU and contiguous (copied only when it has to be)."""
    result = tensor.detach()
    if result.device.type != "cpu":
        result = result.to("cpu")
    if not result.is_contiguous():
        result = result.contiguous()
    return result


def _write_all(fd: int, view: memoryview, checksum: Crc32) -> None:
    for offset in range(0, len(view), CHUNK_SIZE):
        piece = view[offset : offset + CHUNK_SIZE]
        written = 0
        while written < len(piece):
            written += os.write(fd, piece[written:])
        checksum.feed(piece)


def encode_header(
    entries: list[tuple[str, torch.Tensor]], metadata: Mapping[str, str] | None
) -> bytes:
    """The length prefix and padded JSON header for ``entries``, laid out in the given order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, tensor in entries:
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": safetensors_code(tensor.dtype, name),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded


def file_order(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Largest element size first, then by name: every tensor then starts aligned."""
    return sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))


def write_safetensors(
    path: PathLike,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    *,
    durable: bool = True,
) -> FileRecord:
    """Write ``tensors`` to ``path`` (replacing it), fsynced when ``durable``.

    Files of at least :data:`DIRECT_IO_MIN_BYTES` go through :class:`DirectFileWriter`
    (``O_DIRECT``); smaller ones through the page cache. Tensors on other devices are copied to
    the CPU one at a time. ``path`` is written in place: use
    :func:`accel_ckpt.atomic.atomic_file` or a temporary checkpoint folder for atomicity.

    Returns:
        The file's size and CRC-32.

    Raises:
        InvalidArgumentError: A value is not a plain dense tensor (a ``DTensor``, a meta or
            sparse tensor...); nothing is written then.

    """
    for name, tensor in tensors.items():
        require_plain_tensor(tensor, f"tensor {name!r}")
    entries = file_order(tensors)
    prefix = encode_header(entries, metadata)
    total = len(prefix) + sum(t.numel() * t.element_size() for _, t in entries)
    if durable and total >= DIRECT_IO_MIN_BYTES:
        writer = DirectFileWriter(path)
        try:
            writer.write_bytes(prefix)
            for _, tensor in entries:
                writer.write_tensor(cpu_contiguous(tensor))
        except BaseException:
            writer.abort()
            raise
        return writer.close(durable)
    return _write_buffered(path, prefix, entries, durable)


def _write_buffered(
    path: PathLike, prefix: bytes, entries: list[tuple[str, torch.Tensor]], durable: bool
) -> FileRecord:
    checksum = Crc32()
    keepalive: list[torch.Tensor] = []
    kept_bytes = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _write_all(fd, memoryview(prefix), checksum)
        size = len(prefix)
        for _, tensor in entries:
            data = cpu_contiguous(tensor)
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                # The CRC thread may still read this copy: keep it alive until it caught up.
                keepalive.append(data)
                kept_bytes += data.numel() * data.element_size()
            _write_all(fd, tensor_bytes(data), checksum)
            size += data.numel() * data.element_size()
            if kept_bytes > _KEEPALIVE_LIMIT:
                checksum.drain()
                keepalive.clear()
                kept_bytes = 0
        if durable:
            os.fsync(fd)
        crc = checksum.value()
    finally:
        checksum.value()
        os.close(fd)
    return FileRecord(size, crc)


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives in a safetensors file (offsets are absolute)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHeader:
    """The parsed header of a safetensors file."""

    path: str
    specs: tuple[TensorSpec, ...]
    metadata: dict[str, str]
    prefix: bytes
    file_size: int

    @property
    def names(self) -> list[str]:
        """Tensor names in file order."""
        return [spec.name for spec in self.specs]


def _corrupt(path: str, problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path}: {problem}. The file is damaged, truncated or not a safetensors file; "
        "re-save it or restore it from a copy."
    )


def _read_exact(handle: object, view: memoryview, path: str, checksum: Crc32 | None) -> None:
    readinto = handle.readinto  # type: ignore[attr-defined]
    for offset in range(0, len(view), READ_CHUNK_SIZE):
        piece = view[offset : offset + READ_CHUNK_SIZE]
        got = 0
        while got < len(piece):
            count = readinto(piece[got:])
            if not count:
                raise _corrupt(path, "the file ends before the data its header describes")
            got += count
        if checksum is not None:
            checksum.feed(piece)


def _parse_header(handle: object, path: str, file_size: int) -> SafetensorsHeader:
    if file_size < 8:
        raise _corrupt(path, f"it is {file_size} bytes long, shorter than the 8-byte length prefix")
    first = bytearray(8)
    _read_exact(handle, memoryview(first), path, None)
    (length,) = struct.unpack("<Q", first)
    if length > MAX_HEADER_SIZE or 8 + length > file_size:
        raise _corrupt(path, f"its header claims {length} bytes but the file has {file_size}")
    raw = bytearray(length)
    _read_exact(handle, memoryview(raw), path, None)
    try:
        header = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _corrupt(path, f"its header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "its header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _corrupt(path, "its __metadata__ is not a string-to-string map")
    data_start = 8 + length
    specs = []
    for name, entry in header.items():
        try:
            dtype = torch_dtype(str(entry["dtype"]), name, path)
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _corrupt(path, f"the header entry of {name!r} is malformed: {entry!r}") from None
        numel = 1
        for dim in shape:
            numel *= dim
        itemsize = torch.empty((), dtype=dtype).element_size()
        if min(shape, default=0) < 0 or end - begin != numel * itemsize or begin < 0:
            raise _corrupt(
                path, f"tensor {name!r} has shape {list(shape)} but offsets {begin}..{end}"
            )
        specs.append(TensorSpec(name, dtype, shape, data_start + begin, data_start + end))
    specs.sort(key=lambda spec: (spec.start, spec.end))
    position = data_start
    for spec in specs:
        if spec.start != position:
            raise _corrupt(path, f"tensor {spec.name!r} does not start where the previous one ends")
        position = spec.end
    if position != file_size:
        raise _corrupt(
            path, f"the header describes {position} bytes but the file has {file_size} bytes"
        )
    return SafetensorsHeader(path, tuple(specs), dict(metadata), bytes(first + raw), file_size)


def read_header(path: PathLike) -> SafetensorsHeader:
    """Parse and validate the header of the safetensors file at ``path`` (reads no tensor data)."""
    name = os.fspath(path)
    with open(name, "rb", buffering=0) as handle:
        return _parse_header(handle, name, os.fstat(handle.fileno()).st_size)


def _fits(target: torch.Tensor, spec: TensorSpec) -> bool:
    return (
        target.device.type == "cpu"
        and target.dtype == spec.dtype
        and tuple(target.shape) == spec.shape
        and target.is_contiguous()
        and not target.is_sparse
        and target.layout == torch.strided
    )


@dataclass
class LoadedTensors:
    """What :func:`read_safetensors` returns.

    Attributes:
        tensors: Every tensor of the file by name; those in ``direct`` are the caller's targets.
        metadata: The file's ``__metadata__``.
        direct: Names whose bytes were read straight into the matching target tensor.

    """

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]
    direct: set[str]


def read_safetensors(
    path: PathLike,
    *,
    targets: Mapping[str, torch.Tensor] | None = None,
    expected: FileRecord | None = None,
) -> LoadedTensors:
    """Read a whole safetensors file, validating its structure (and size and CRC-32 if given).

    Args:
        path: The file.
        targets: Tensors to read into where dtype, shape and layout match (CPU, contiguous);
            the others are read into new tensors.
        expected: Size and checksum from a manifest; a mismatch raises.

    Raises:
        CorruptCheckpointError: Bad header, wrong size or checksum; names the file.

    """
    name = os.fspath(path)
    targets = targets or {}
    checksum = Crc32() if expected is not None else None
    try:
        with open(name, "rb", buffering=0) as handle:
            header, tensors, direct = _read_file(handle, name, targets, expected, checksum)
        crc = checksum.value() if checksum is not None else None
    finally:
        if checksum is not None:
            checksum.value()
    if crc is not None and expected is not None and crc != expected.crc32:
        raise _corrupt(name, f"its CRC-32 is {crc:08x} but the manifest says {expected.crc32:08x}")
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is not None:
        for key in direct:
            bump(tensors[key])
    return LoadedTensors(tensors, header.metadata, direct)


def _read_file(
    handle: object,
    name: str,
    targets: Mapping[str, torch.Tensor],
    expected: FileRecord | None,
    checksum: Crc32 | None,
) -> tuple[SafetensorsHeader, dict[str, torch.Tensor], set[str]]:
    fileno = handle.fileno()  # type: ignore[attr-defined]
    file_size = os.fstat(fileno).st_size
    if expected is not None and file_size != expected.size:
        raise _corrupt(name, f"it is {file_size} bytes long but the manifest says {expected.size}")
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fileno, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    header = _parse_header(handle, name, file_size)
    if checksum is not None:
        checksum.feed(header.prefix)
    direct = {s.name for s in header.specs if s.name in targets and _fits(targets[s.name], s)}
    tensors: dict[str, torch.Tensor] = {}
    for spec in header.specs:
        # Each tensor gets its own storage: some torch functions ignore a storage offset.
        tensor = (
            targets[spec.name] if spec.name in direct else torch.empty(spec.shape, dtype=spec.dtype)
        )
        if spec.nbytes:
            _read_exact(handle, tensor_bytes(tensor.detach()), name, checksum)
        tensors[spec.name] = tensor
    return header, tensors, direct


def iter_safetensors(
    path: PathLike,
    *,
    targets: Mapping[str, torch.Tensor] | None = None,
    mapped: Collection[str] = (),
) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """Read a safetensors file one tensor at a time: ``(name, tensor, read_into_target)``.

    Like :func:`read_safetensors` without a checksum, but each tensor is handed over as soon as
    it is read, so a caller that moves it elsewhere (another device, the disk) holds one tensor
    at a time instead of the whole file. Tensors named in ``mapped`` are not read: they come back
    as views of a private, copy-on-write memory map of the file (pages are read from the page
    cache when first touched, and shared with it until written), when their offset is aligned.
    """
    name = os.fspath(path)
    targets = targets or {}
    bump = getattr(torch.autograd.graph, "increment_version", None)
    with open(name, "rb", buffering=0) as handle:
        fileno = handle.fileno()
        file_size = os.fstat(fileno).st_size
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fileno, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        header = _parse_header(handle, name, file_size)
        storage: Any = None
        position = len(header.prefix)
        for spec in header.specs:
            direct = spec.name in targets and _fits(targets[spec.name], spec)
            itemsize = torch.empty((), dtype=spec.dtype).element_size()
            if spec.name in mapped and not direct and spec.nbytes and spec.start % itemsize == 0:
                if storage is None:
                    storage = torch.UntypedStorage.from_file(name, False, file_size)
                tensor = torch.empty(0, dtype=spec.dtype).set_(
                    storage,
                    spec.start // itemsize,
                    spec.shape,
                    _contiguous_strides(spec.shape),
                )
                yield spec.name, tensor, False
                del tensor
                continue
            tensor = targets[spec.name] if direct else empty_released(list(spec.shape), spec.dtype)
            if spec.nbytes:
                if position != spec.start:
                    handle.seek(spec.start)
                _read_exact(handle, tensor_bytes(tensor.detach()), name, None)
                position = spec.end
            if direct and bump is not None:
                bump(tensor)
            yield spec.name, tensor, direct
            del tensor


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
