"""Small models and comparisons shared by the tests, the spawned workers and the crash driver."""

from __future__ import annotations

import random

import torch
from torch import nn


class TiedLM(nn.Module):
    """Embedding and output layer sharing one weight, plus a non-trainable buffer."""

    def __init__(self, vocab: int = 50, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("position", torch.arange(8))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def mlp(width: int = 8, depth: int = 2) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


class Counter:
    """A custom checkpointable object holding assorted plain data and a tensor."""

    def __init__(self) -> None:
        self.state: dict = {
            "steps": 0,
            "history": [0.5, float("inf")],
            "pair": (1, "two"),
            "table": {3: "three"},
            "tensor": torch.zeros(3),
        }

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


class LoaderState:
    """Stands in for an accel-data dataloader: ``state_dict`` reports a position."""

    def __init__(self, position: int = 0, seed: int = 0) -> None:
        self.position = position
        self.seed = seed

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "order": torch.arange(4) + self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.seed = state["seed"]


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2, seed: int = 0
) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        if isinstance(model, TiedLM) or isinstance(getattr(model, "module", None), TiedLM):
            tokens = torch.randint(0, 50, (4, 5), generator=generator)
            loss = model(tokens).square().mean()
        else:
            first = next(model.parameters())
            loss = model(torch.randn(4, first.shape[1], generator=generator)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def training_setup(seed: int) -> dict:
    """Two models, two optimizers, a scheduler and a custom object, trained a little."""
    torch.manual_seed(seed)
    lm, net = TiedLM(), mlp()
    opt_lm = torch.optim.AdamW(lm.parameters(), lr=1e-2)
    opt_net = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt_lm, step_size=1, gamma=0.5)
    train(lm, opt_lm, seed=seed)
    train(net, opt_net, seed=seed + 1)
    scheduler.step()
    counter = Counter()
    counter.state["steps"] = seed
    counter.state["tensor"] = torch.full((3,), float(seed))
    return {
        "models": [lm, net],
        "optimizers": [opt_lm, opt_net],
        "schedulers": [scheduler],
        "custom_objects": [counter],
    }


def fresh_setup() -> dict:
    """Objects of the same shapes as training_setup, with other values (and empty optimizers)."""
    torch.manual_seed(12345)
    lm, net = TiedLM(), mlp()
    opt_lm = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    opt_net = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt_lm, step_size=3, gamma=0.1)
    return {
        "models": [lm, net],
        "optimizers": [opt_lm, opt_net],
        "schedulers": [scheduler],
        "custom_objects": [Counter()],
    }


def same(a: object, b: object) -> bool:
    """Bitwise equality of nested states (tensors compared by dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(as_bytes(a), as_bytes(b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def snapshot(setup: dict) -> dict:
    """Deep copies of every state in a setup, for later comparison."""
    import copy

    return {
        kind: [copy.deepcopy(obj.state_dict()) for obj in objects]
        for kind, objects in setup.items()
    }


def rng_draws() -> tuple:
    import numpy as np

    return (random.random(), float(np.random.rand()), torch.rand(2).tolist())
