"""accel-state + accel-ops alone: collectives over nested structures on 2 real processes."""

import torch

from accel_ops import broadcast_object_list, gather, gather_object, pad_across_processes, reduce
from accel_state import PartialState
from accel_state.testing import spawn_workers


def exercise() -> str:
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    batch = {"x": torch.full((2,), float(rank)), "y": [torch.tensor([rank])]}
    gathered = gather(batch)
    assert gathered["x"].tolist() == [float(r) for r in range(world) for _ in range(2)], gathered
    assert reduce(torch.tensor([1.0 + rank]), "sum").item() == sum(1.0 + r for r in range(world))
    assert gather_object([{"rank": rank}]) == [{"rank": r} for r in range(world)]
    assert broadcast_object_list([f"from {rank}"], from_process=1) == ["from 1"]
    padded = pad_across_processes(torch.ones(rank + 1), dim=0)
    assert padded.shape == (world,), padded
    return "ok"


if __name__ == "__main__":
    assert spawn_workers(exercise, 2, timeout=300) == ["ok", "ok"]
    print("accel-state + accel-ops ok on 2 processes")
