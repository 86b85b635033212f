"""Functions run on spawned processes for test_dcp_planning.py (importable by module name)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, load, save
from torch.distributed.device_mesh import init_device_mesh

from accel_ckpt.dcp_planning import ScalableLoadPlanner, ScalableSavePlanner
from accel_state import PartialState

try:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
except ImportError:  # torch 2.4
    from torch.distributed._tensor import (  # type: ignore[no-redef]
        Replicate,
        Shard,
        distribute_tensor,
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _bits(tensor: torch.Tensor) -> list[int]:
    return tensor.contiguous().view(torch.int32).flatten().tolist()


def saves_twice_and_reloads(root: str) -> dict[str, Any]:
    """Save a DTensor state twice through ScalableSavePlanner, reload it resharded; facts."""
    rank = PartialState().process_index
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    full = {"w": torch.randn(11, 6), "b": torch.randn(7), "r": torch.randn(3, 3)}
    placements = {"w": [Shard(0)], "b": [Shard(0)], "r": [Replicate()]}
    state = {
        "model": {k: distribute_tensor(v, mesh, placements[k]) for k, v in full.items()},
        "step": 3,
    }
    collect = _Collect()
    logger = logging.getLogger("accel_ckpt.dcp_planning")
    logger.addHandler(collect)
    logger.setLevel(logging.DEBUG)
    planners = [ScalableSavePlanner(cache_key="two-process-test") for _ in range(2)]
    try:
        for name, planner in zip(("first", "second"), planners, strict=True):
            save(state, checkpoint_id=Path(root) / name, planner=planner)
    finally:
        logger.removeHandler(collect)
    metadata = [
        FileSystemReader(str(Path(root) / name)).read_metadata() for name in ("first", "second")
    ]

    # Reload the second checkpoint resharded: w along dim 1, b replicated, r along dim 0.
    targets = {"w": [Shard(1)], "b": [Replicate()], "r": [Shard(0)]}
    restored = {
        "model": {
            k: distribute_tensor(torch.zeros_like(v), mesh, targets[k]) for k, v in full.items()
        },
        "step": 0,
    }
    load(restored, checkpoint_id=Path(root) / "second", planner=ScalableLoadPlanner())
    return {
        "rank": rank,
        "reused": [planner.reused_cached_plan for planner in planners],
        "logs": collect.messages,
        "same_metadata": metadata[0].state_dict_metadata == metadata[1].state_dict_metadata,
        "bits_equal": {
            k: _bits(restored["model"][k].full_tensor()) == _bits(v) for k, v in full.items()
        },
        "step": restored["step"],
    }
