"""Freeing a stopped process group from the objects that still hold it (after ``end_training``).

``end_training`` destroys the process group, but DDP wrappers (their reducer), sharded models
(their meshes) and DeepSpeed (its cached groups) keep the group object alive. Freed later, when
the script's function returns, a reducer drops the group's last reference while holding the GIL,
and the group's gloo thread, still releasing the tensors of the last collective, waits for the
GIL: the process hangs (or, freed during interpreter shutdown, aborts with "terminate called
without an active exception"). Releasing the references right after the group is destroyed lets
the group join its threads with the GIL released.
"""

from __future__ import annotations

import sys
from typing import Any

import torch.distributed as dist


def release_stopped_group(*roots: Any) -> None:
    """Drop every reference to the destroyed group from wrappers, sharded models and ``roots``.

    Does nothing while a default group is running (a group accel did not start, say).

    Args:
        roots: More objects to free the group from (the Accelerator's strategy: DeepSpeed
            engines).
    """
    if not dist.is_available() or dist.is_initialized():
        return
    from accel.strategies.ddp import release_all_wrappers
    from accel.strategies.fsdp import sharded_models
    from accel_state.process_group import release_group_references

    release_all_wrappers()
    extra: list[Any] = [*sharded_models(), *roots]
    deepspeed_groups = sys.modules.get("deepspeed.utils.groups")
    if deepspeed_groups is not None:  # DeepSpeed's cached world and data-parallel groups
        extra.append(vars(deepspeed_groups))
    release_group_references(*extra)
