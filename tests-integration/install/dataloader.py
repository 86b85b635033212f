"""accel-state + accel-ops + accel-data alone: a prepared dataloader shards one dataset over 2 processes."""

import torch

from accel_data import prepare_data_loader, set_seed
from accel_ops import gather_object
from accel_state import PartialState
from accel_state.testing import spawn_workers


def exercise() -> list[int]:
    PartialState()
    set_seed(7)
    dataset = torch.utils.data.TensorDataset(torch.arange(23))
    loader = prepare_data_loader(torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True))
    mine = [int(value) for (batch,) in loader for value in batch]
    everyone = sorted(set(gather_object(mine)))
    assert everyone == list(range(23)), everyone
    return mine


if __name__ == "__main__":
    first, second = spawn_workers(exercise, 2, timeout=300)
    assert first and second and len(first) == len(second), (first, second)
    print("accel-state + accel-ops + accel-data ok on 2 processes")
