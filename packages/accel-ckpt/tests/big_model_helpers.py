"""Small transformer-like models for the big-model tests (also imported by the RSS child)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A residual MLP block: must not be split across devices."""

    def __init__(self, width: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or 4 * width
        self.ln = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.ln(x))))


class TinyLM(nn.Module):
    """Embedding, blocks, final norm and a head tied to the embedding."""

    def __init__(self, vocab: int = 100, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(width), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids) * self.scale
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(self.norm(hidden))


class Stack(nn.Module):
    """Blocks only: a model whose size is easy to choose."""

    def __init__(self, width: int, depth: int, hidden: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x
