"""Run by every XLA replica of a multi-device job (accel_state.testing.spawn_xla_workers)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_data import prepare_data_loader, set_seed
from accel_state import PartialState


def sharded_epochs(size: int, batch_size: int) -> dict:
    """Two shuffled epochs of a prepared loader: this replica's samples, and where they were."""
    state = PartialState()
    set_seed(0)
    loader = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(size)), batch_size=batch_size, shuffle=True),
        put_on_device=True,
    )
    epochs, devices = [], set()
    for _ in range(2):
        seen = []
        for (batch,) in loader:
            devices.add(batch.device.type)
            seen.extend(batch.cpu().tolist())
        epochs.append(seen)
    return {
        "rank": state.process_index,
        "type": type(loader).__name__,
        "epochs": epochs,
        "devices": sorted(devices),
    }
