"""Run by every XLA replica of a multi-device job (accel_state.testing.spawn_xla_workers)."""

from __future__ import annotations

import torch
from ckpt_helpers import mlp

from accel_ckpt import load_state, save_state
from accel_state import PartialState


def save_and_load(folder: str) -> dict:
    """Every replica saves the same model and its own step count; then loads them back."""
    state = PartialState()
    torch.manual_seed(0)
    model = mlp().to(state.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 8, device=state.device)).sum().backward()
    optimizer.step()
    expected = [parameter.detach().cpu() for parameter in model.parameters()]
    save_state(folder, models=[model], optimizers=[optimizer])
    torch.manual_seed(1)
    fresh = mlp().to(state.device)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    load_state(folder, models=[fresh], optimizers=[fresh_optimizer])
    loaded = [parameter.detach().cpu() for parameter in fresh.parameters()]
    return {
        "rank": state.process_index,
        "devices": sorted({parameter.device.type for parameter in fresh.parameters()}),
        "equal": all(torch.equal(a, b) for a, b in zip(expected, loaded, strict=True)),
    }
