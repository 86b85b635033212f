"""Single-tensor and pickled-object primitives over the default group, per backend.

gloo and MPI gather through the list form of ``all_gather``; NCCL-like backends through
``all_gather_into_tensor``; the ``xla`` backend through torch_xla. Objects travel as pickled
bytes in uint8 tensors, so (unlike ``torch.distributed.all_gather_object``) numpy is not needed.
"""

from __future__ import annotations

import ctypes
import pickle
from typing import Any

import torch
import torch.distributed as dist

from accel_ops import xla
from accel_ops.group import GroupInfo, default_device

# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns).
_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_SMALL_NUMEL = 4096


def gather_tensor(tensor: torch.Tensor, group: GroupInfo) -> torch.Tensor:
    """All-gather one tensor along dimension 0 (a 0-d tensor counts as shape ``[1]``)."""
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    if group.is_xla:
        return xla.gather(tensor)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    world_size = group.world_size
    if not group.list_gather_only and not tensor.is_cpu:
        output = tensor.new_empty((world_size * tensor.shape[0], *tensor.shape[1:]))
        _gather_into_tensor(output, tensor, group=group.process_group)
        return output
    if tensor.numel() < _SMALL_NUMEL:
        # Small: separate buffers and a cat cost less than slicing views of one output.
        parts = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(parts, tensor, group=group.process_group)
        return torch.cat(parts)
    # Large: each process's part lands straight in its slice of the output, with no cat copy.
    output = tensor.new_empty((world_size * tensor.shape[0], *tensor.shape[1:]))
    views = list(output.view(world_size, *tensor.shape).unbind(0))
    dist.all_gather(views, tensor, group=group.process_group)
    return output


def broadcast_tensor(tensor: torch.Tensor, group: GroupInfo, from_process: int) -> torch.Tensor:
    """Overwrite ``tensor`` in place with the one held by ``from_process`` and return it."""
    if group.is_xla:
        return xla.broadcast(tensor, from_process)
    handle = group.process_group
    source = from_process if handle is None else dist.get_global_rank(handle, from_process)
    if tensor.is_contiguous():
        dist.broadcast(tensor, src=source, group=handle)
        return tensor
    buffer = tensor.contiguous()
    dist.broadcast(buffer, src=source, group=handle)
    return tensor.copy_(buffer)


def _to_bytes_tensor(obj: Any, device: torch.device) -> torch.Tensor:
    payload = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return torch.frombuffer(payload, dtype=torch.uint8).to(device)


def _from_bytes_tensor(tensor: torch.Tensor, size: int) -> Any:
    tensor = tensor.cpu().contiguous()
    return pickle.loads(ctypes.string_at(tensor.data_ptr(), size))


def all_gather_objects(obj: Any, group: GroupInfo) -> list[Any]:
    """Every process's picklable ``obj``, indexed by rank (two collectives: sizes, then bytes)."""
    if group.is_xla:
        return xla.all_gather_objects(obj)
    device = default_device(group)
    payload = _to_bytes_tensor(obj, device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = gather_tensor(size, group).tolist()
    padded = payload.new_zeros(max(sizes))
    padded[: payload.numel()] = payload
    rows = gather_tensor(padded, group).view(group.world_size, -1).cpu()
    return [_from_bytes_tensor(row, length) for row, length in zip(rows, sizes, strict=True)]


def broadcast_objects(objects: list[Any], group: GroupInfo, from_process: int) -> list[Any]:
    """The list ``objects`` held by ``from_process`` (two collectives: size, then bytes)."""
    if group.is_xla:
        return xla.broadcast_objects(objects, from_process)
    device = default_device(group)
    is_source = group.rank == from_process
    payload = _to_bytes_tensor(list(objects), device) if is_source else None
    size = torch.tensor([0 if payload is None else payload.numel()], device=device)
    length = int(broadcast_tensor(size, group, from_process).item())
    if payload is None:
        payload = torch.empty(length, dtype=torch.uint8, device=device)
    broadcast_tensor(payload, group, from_process)
    received: list[Any] = _from_bytes_tensor(payload, length)
    return received
