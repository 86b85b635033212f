"""Models for the ``accel estimate-memory`` tests (imported by MODEL_SPEC)."""

import torch
from torch import nn


class Small(nn.Module):
    """embed 1000*h + proj (h*10 + 10) + norm 2h parameters; a 3-element buffer."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, hidden)
        self.proj = nn.Linear(hidden, 10)
        self.norm = nn.LayerNorm(hidden)
        self.register_buffer("scale", torch.ones(3))
        assert self.embed.weight.device.type == "meta"  # built without allocating


def tied(hidden: int = 8) -> nn.Module:
    """A head sharing the embedding's weight: counted once."""
    model = nn.Sequential(nn.Embedding(100, hidden), nn.Linear(hidden, 100, bias=False))
    model[1].weight = model[0].weight
    return model


def not_a_model() -> int:
    return 3
