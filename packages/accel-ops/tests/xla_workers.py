"""Run by every XLA replica of a multi-device job (accel_state.testing.spawn_xla_workers).

Every collective on XLA tensors across the replicas; values that depend on the replica's ordinal
make a wrong source or order visible. Returned on the host for the test to compare.
"""

from __future__ import annotations

import torch

import accel_ops
from accel_state import PartialState


def all_collectives() -> dict:
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    device = state.device
    mine = torch.full((2,), float(rank), device=device)
    ragged = torch.arange(rank + 1, device=device)
    source = torch.full((3,), 7.0 if rank == 0 else -1.0, device=device)
    objects = accel_ops.broadcast_object_list([f"from {rank}"] if rank == 0 else [None])
    return {
        "device": mine.device.type,
        "world": world,
        "gather": accel_ops.gather({"x": mine})["x"].cpu().tolist(),
        "gather_0d": accel_ops.gather(torch.tensor(float(rank), device=device)).cpu().tolist(),
        "gather_object": accel_ops.gather_object([rank, f"r{rank}"]),
        "broadcast": accel_ops.broadcast(source).cpu().tolist(),
        "broadcast_object_list": objects,
        "sum": accel_ops.reduce(mine, "sum").cpu().tolist(),
        "mean": accel_ops.reduce(mine, "mean").cpu().tolist(),
        "max": accel_ops.reduce(mine, "max").cpu().tolist(),
        "padded": accel_ops.pad_across_processes(ragged, pad_index=-1).cpu().tolist(),
        "copied": accel_ops.copy_tensor_to_devices(mine if rank == 0 else None).cpu().tolist(),
    }
