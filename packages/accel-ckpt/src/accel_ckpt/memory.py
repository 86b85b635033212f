"""Raw views of tensor memory and single-threaded copies between them.

``ctypes.memmove`` releases the GIL and runs on one core; on a busy machine it copies host memory
about twice as fast as ``Tensor.copy_``, whose parallel copy waits for its slowest thread.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
from typing import Any

import torch

from accel_ckpt.errors import InvalidArgumentError


def require_plain_tensor(tensor: object, name: str) -> None:
    """Refuse anything a checkpoint file cannot hold as raw bytes, naming it.

    Accepted: dense (strided) tensors with memory of their own on a real device, whose type is
    ``torch.Tensor``, ``torch.nn.Parameter`` or a subclass of ``Parameter`` (quantized-weight
    parameters). Refused: tensor subclasses such as ``DTensor``, ``ShardedTensor`` or fake
    tensors (their ``data_ptr`` is not their data), meta tensors (no data), sparse, nested and
    quantized tensors (their bytes are not the values).

    Args:
        tensor: The value about to be written.
        name: How the error names it (``tensor 'layer.weight'``, ``optimizer 0: state.0.exp_avg``).

    Raises:
        InvalidArgumentError: ``tensor`` is not a plain dense tensor; the message names ``name``,
            the type and the fix.
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"{name} is a {_type_name(tensor)}, not a tensor; only tensors are written as data."
        )
    kind = type(tensor)
    if kind is not torch.Tensor and not issubclass(kind, torch.nn.Parameter):
        raise InvalidArgumentError(
            f"{name} is a {_type_name(tensor)}, a tensor subclass whose memory is not its "
            "values, so it cannot be written to a checkpoint file. Gather a DTensor or "
            "ShardedTensor first (.full_tensor(), or accelerator.get_state_dict(model) for a "
            "sharded model) or convert it with .as_subclass(torch.Tensor) if it holds plain data."
        )
    if tensor.layout != torch.strided or tensor.is_nested:
        raise InvalidArgumentError(
            f"{name} is a {tensor.layout} tensor; only dense tensors are written. Convert it "
            "with .to_dense() first."
        )
    if tensor.is_quantized:
        raise InvalidArgumentError(
            f"{name} is a quantized tensor ({tensor.dtype}); write .dequantize() or its int_repr()."
        )
    if tensor.device.type == "meta":
        raise InvalidArgumentError(
            f"{name} is on the meta device: it has a shape but no data. Load or initialise "
            "its values (for example with load_checkpoint_in_model) before saving it."
        )


def _type_name(value: object) -> str:
    kind = type(value)
    return (
        kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    )


def _address(tensor: torch.Tensor, start: int, nbytes: int) -> int:
    """The address of bytes ``start:start + nbytes`` of a contiguous CPU tensor, checked.

    Checked: a plain dense tensor (:func:`require_plain_tensor`) on the CPU, contiguous, whose
    own storage covers the requested bytes. Nothing reads through a pointer this did not check.
    """
    require_plain_tensor(tensor, "tensor")
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise InvalidArgumentError(
            f"raw bytes need a contiguous CPU tensor, got one on {tensor.device} "
            f"(contiguous={tensor.is_contiguous()}); copy it with .cpu().contiguous() first."
        )
    total = tensor.numel() * tensor.element_size()
    storage = tensor.untyped_storage()
    offset = int(tensor.storage_offset()) * tensor.element_size()
    if start < 0 or nbytes < 0 or start + nbytes > total or offset + total > storage.nbytes():
        raise InvalidArgumentError(
            f"bytes {start}:{start + nbytes} are outside the tensor's {total} bytes "
            f"(storage of {storage.nbytes()} bytes at offset {offset})."
        )
    base = storage.data_ptr()
    if base == 0 and total:
        raise InvalidArgumentError("the tensor has no allocated storage; nothing to read.")
    return base + offset + start


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A zero-copy, writable byte view of a contiguous CPU tensor; keep ``tensor`` alive meanwhile.

    Raises:
        InvalidArgumentError: Not a plain dense contiguous CPU tensor with storage of its own.
    """
    nbytes = tensor.numel() * tensor.element_size()
    address = _address(tensor, 0, nbytes)
    if nbytes == 0:
        return memoryview(bytearray())
    array = (ctypes.c_ubyte * nbytes).from_address(address)
    return memoryview(array).cast("B")


def address_of(buffer: object) -> int:
    """Address of the first byte of a writable buffer (``mmap``, ``bytearray``...)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))  # type: ignore[arg-type]


def copy_from_tensor(destination: int, tensor: torch.Tensor, start: int, nbytes: int) -> None:
    """Copy bytes ``start:start + nbytes`` of a contiguous CPU tensor to address ``destination``."""
    if nbytes:
        ctypes.memmove(destination, _address(tensor, start, nbytes), nbytes)


def snapshot_into(destination: torch.Tensor, source: torch.Tensor) -> None:
    """``destination.copy_(source)``, by ``memmove`` when both are contiguous CPU tensors."""
    if (
        source.device.type == "cpu"
        and source.is_contiguous()
        and destination.is_contiguous()
        and source.dtype == destination.dtype
    ):
        copy_from_tensor(destination.data_ptr(), source, 0, source.numel() * source.element_size())
    else:
        destination.copy_(source, non_blocking=destination.is_pinned())


#: Tensors at least this large are read into their own anonymous memory map.
_MAPPED_MIN_BYTES = 1 << 20


def empty_released(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor whose memory goes back to the OS as soon as it is freed.

    Large tensors get their own anonymous ``mmap``: weights read for one forward pass and dropped
    after it would otherwise stay in the allocator's heap (glibc keeps freed chunks below its
    adaptive mmap threshold), so the process would keep the memory of every offloaded layer.
    """
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes < _MAPPED_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes)
    return torch.frombuffer(region, dtype=dtype, count=numel).view(shape)


@functools.cache
def _libc_malloc_trim() -> Any:
    """Glibc's ``malloc_trim``, or ``None`` on other C libraries."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Give the allocator's free heap pages back to the OS (glibc ``malloc_trim``; else no-op).

    Libraries that quantize or convert tensors allocate large temporaries that land in the heap
    once glibc has raised its mmap threshold; freed, they would stay in the process's RSS.
    """
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)
