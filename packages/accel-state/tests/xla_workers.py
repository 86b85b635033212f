"""Functions run by every XLA replica (through accel_state.testing.spawn_xla_workers)."""

from __future__ import annotations

import torch.distributed as dist

from accel_state import PartialState


def replica_facts() -> dict:
    """What this replica's PartialState says, after a barrier and one main-process-first block."""
    state = PartialState()
    state.wait_for_everyone()
    order = []
    with state.main_process_first():
        order.append(state.process_index)
    return {
        "device": state.device.type,
        "distributed_type": state.distributed_type.value,
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "main": state.is_main_process,
        "backend": state.backend,
        "source": state.layout.source,
        "group_backend": str(dist.get_backend()) if dist.is_initialized() else None,
        "order": order,
    }
