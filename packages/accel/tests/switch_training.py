"""One small training run written for Accelerate's API, shared by the fixture and the tests.

``tests/data/accelerate/make_fixture.py`` runs it with Hugging Face Accelerate to write real
Accelerate checkpoints; the tests run it with accel, load those checkpoints and continue.
Nothing here imports either library: the ``Accelerator`` is passed in.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

ACCUMULATION = 2
STEPS_BEFORE = 6
STEPS_AFTER = 4


class Counter:
    """A registered custom object, as in Accelerate's docs."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def build() -> tuple[Any, ...]:
    """Two models, two optimizers (AdamW, SGD with momentum) and a scheduler."""
    torch.manual_seed(0)
    first = torch.nn.Linear(3, 2)
    second = torch.nn.Linear(2, 1)
    opt_first = torch.optim.AdamW(first.parameters(), lr=0.05)
    opt_second = torch.optim.SGD(second.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt_first, step_size=2, gamma=0.5)
    return first, second, opt_first, opt_second, scheduler


def train(accelerator: Any, objects: tuple[Any, ...], steps: int) -> list[float]:
    """``steps`` micro-steps on inputs drawn from the global torch RNG; the losses."""
    first, second, opt_first, opt_second, scheduler = objects
    losses = []
    for _ in range(steps):
        with accelerator.accumulate(first, second):
            inputs = torch.randn(4, 3)
            loss = second(torch.tanh(first(inputs))).pow(2).mean()
            accelerator.backward(loss)
            opt_first.step()
            opt_second.step()
            scheduler.step()
            opt_first.zero_grad()
            opt_second.zero_grad()
        losses.append(loss.item())
    return losses


def weights(accelerator: Any, objects: tuple[Any, ...]) -> list[list[float]]:
    """Every parameter of both models, flattened."""
    return [
        p.detach().flatten().tolist()
        for model in objects[:2]
        for p in accelerator.unwrap_model(model).parameters()
    ]


def snapshot(accelerator: Any, objects: tuple[Any, ...], counter: Counter) -> dict[str, Any]:
    """What a resumed run must see: step, weights, optimizer moments, LR, counter."""
    opt_first, opt_second, scheduler = objects[2:]
    adam = opt_first.state_dict()["state"]
    momentum = opt_second.state_dict()["state"]
    return {
        "step": accelerator.step,
        "weights": weights(accelerator, objects),
        "exp_avg": [adam[i]["exp_avg"].flatten().tolist() for i in sorted(adam)],
        "momentum": [momentum[i]["momentum_buffer"].flatten().tolist() for i in sorted(momentum)],
        "lr": scheduler.get_last_lr(),
        "counter": counter.value,
    }


def draws() -> dict[str, float]:
    """One value from Python's and numpy's generators (torch's is checked by training)."""
    return {"python": random.random(), "numpy": float(np.random.rand())}
