"""Pipeline-parallel inference run inside spawned worker processes."""

from __future__ import annotations

from typing import Any

import torch

from accel import prepare_pippy


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def make() -> tuple[Stack, torch.Tensor]:
    torch.manual_seed(0)
    return Stack().eval(), torch.randn(8, 6, generator=torch.Generator().manual_seed(1))


def pippy_job() -> dict[str, Any]:
    from accel_state import PartialState

    state = PartialState()
    model, batch = make()
    expected = model(batch)
    chunks = 4
    model = prepare_pippy(model, example_args=(batch[: 8 // chunks],), num_chunks=chunks)
    with torch.no_grad():
        output = model(batch)
    gathered_model, _ = make()
    gathered_model = prepare_pippy(
        gathered_model, split_points=["layers.1"], example_args=(batch[:4],), gather_output=True
    )
    with torch.no_grad():
        gathered = gathered_model(batch)
    return {
        "rank": state.process_index,
        "split_points": model.hf_split_points,
        "output": None if output is None else torch.allclose(output, expected, atol=1e-6),
        "gathered": torch.allclose(gathered, expected, atol=1e-6),
    }
