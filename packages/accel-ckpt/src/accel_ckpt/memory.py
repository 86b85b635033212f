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


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A zero-copy, writable byte view of a contiguous CPU tensor; keep ``tensor`` alive meanwhile."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    array = (ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())
    return memoryview(array).cast("B")


def address_of(buffer: object) -> int:
    """Address of the first byte of a writable buffer (``mmap``, ``bytearray``...)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))  # type: ignore[arg-type]


def copy_from_tensor(destination: int, tensor: torch.Tensor, start: int, nbytes: int) -> None:
    """Copy bytes ``start:start + nbytes`` of a contiguous CPU tensor to address ``destination``."""
    if nbytes:
        ctypes.memmove(destination, tensor.data_ptr() + start, nbytes)


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
