"""Training with every kind of sampler, prepared by the Accelerator and in plain PyTorch.

Run inside spawned worker processes (importable by module name). Each case trains the same model
twice from the same seeds: with plain PyTorch in this one process, and with ``Accelerator.prepare``
on the job's processes. The plain run accumulates the gradients of ``num_processes`` consecutive
batches per step, which is the average DDP computes over one batch per process, so the weights
must agree bit for bit when the order does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

from accel import Accelerator
from accel.utils import set_seed

SIZE = 48  # every epoch is a whole number of steps on 1 and 2 processes (batches of 4)
EPOCHS = 3


def dataset() -> TensorDataset:
    """Fixed features and targets, and each sample's index (to record the order)."""
    generator = torch.Generator().manual_seed(1234)
    features = torch.randn(SIZE, 5, generator=generator)
    targets = torch.randn(SIZE, 1, generator=generator)
    return TensorDataset(features, targets, torch.arange(SIZE))


class BlockShuffleSampler(Sampler[int]):
    """A custom sampler: blocks of consecutive indices in random order, some reversed."""

    def __init__(self, size: int, block: int, generator: torch.Generator) -> None:
        self.size, self.block, self.generator = size, block, generator

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.size // self.block, generator=self.generator).tolist()
        flips = (torch.rand(len(order), generator=self.generator) < 0.5).tolist()
        for start, flip in zip(order, flips, strict=True):
            block = list(range(start * self.block, (start + 1) * self.block))
            yield from reversed(block) if flip else block

    def __len__(self) -> int:
        return self.size


class ShuffledChunks(Sampler[list[int]]):
    """A custom batch sampler (not a ``BatchSampler``): a permutation cut into chunks."""

    def __init__(self, size: int, batch_size: int, generator: torch.Generator) -> None:
        self.size, self.batch_size, self.generator = size, batch_size, generator
        self.drop_last = False

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.size, generator=self.generator).tolist()
        for start in range(0, self.size, self.batch_size):
            yield order[start : start + self.batch_size]

    def __len__(self) -> int:
        return -(-self.size // self.batch_size)


@dataclass(frozen=True)
class Case:
    """How to build the DataLoader from the user's generator; whether its sampler draws from it."""

    build: Callable[[TensorDataset, torch.Generator], DataLoader]
    sampler_uses_generator: bool


CASES: dict[str, Case] = {
    "shuffle_generator": Case(
        lambda data, g: DataLoader(data, batch_size=4, shuffle=True, generator=g), True
    ),
    "shuffle": Case(lambda data, g: DataLoader(data, batch_size=4, shuffle=True), False),
    "replacement": Case(
        lambda data, g: DataLoader(
            data,
            batch_size=4,
            sampler=RandomSampler(data, replacement=True, num_samples=72, generator=g),
        ),
        True,
    ),
    "num_samples_no_generator": Case(
        lambda data, g: DataLoader(data, batch_size=4, sampler=RandomSampler(data, num_samples=56)),
        False,
    ),
    "sequential": Case(lambda data, g: DataLoader(data, batch_size=4), False),
    "custom_sampler": Case(
        lambda data, g: DataLoader(data, batch_size=4, sampler=BlockShuffleSampler(SIZE, 4, g)),
        True,
    ),
    "batch_sampler": Case(
        lambda data, g: DataLoader(
            data, batch_sampler=BatchSampler(RandomSampler(data, generator=g), 4, True)
        ),
        True,
    ),
    "sampler_is_batch_sampler": Case(
        lambda data, g: DataLoader(
            data, sampler=BatchSampler(RandomSampler(data), 4, False), batch_size=None
        ),
        False,
    ),
    "custom_batch_sampler": Case(
        lambda data, g: DataLoader(data, batch_sampler=ShuffledChunks(SIZE, 4, g)), True
    ),
}


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and its optimizer, initialised from torch's global generator."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def states(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The user's generator's and torch's global generator's states."""
    return {"generator": generator.get_state(), "torch": torch.get_rng_state()}


def seeds(rank: int) -> tuple[int, torch.Generator]:
    """Seed this process (differently on each) and make the user's generator."""
    set_seed(21, device_specific=True)
    return rank, torch.Generator().manual_seed(500 + rank)


def train_plain(case: Case, rank: int, num_processes: int) -> dict:
    """Plain PyTorch in one process: ``num_processes`` consecutive batches per optimizer step."""
    _, generator = seeds(rank)
    model, optimizer = make_model()
    loader = case.build(dataset(), generator)
    epochs = []
    for _ in range(EPOCHS):
        batches = []
        for x, y, index in loader:
            loss = torch.nn.functional.mse_loss(model(x), y) / num_processes
            loss.backward()
            batches.append(index.tolist())
            if len(batches) % num_processes == 0:
                optimizer.step()
                optimizer.zero_grad()
        epochs.append({"batches": batches, **states(generator)})
    return {"epochs": epochs, "weights": [p.detach().clone() for p in model.parameters()]}


def train_prepared(accelerator: Accelerator, case: Case, rank: int) -> dict:
    """The same training through ``accelerator.prepare``: this process's batches and weights."""
    _, generator = seeds(rank)
    model, optimizer = make_model()
    loader = case.build(dataset(), generator)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    epochs = []
    for _ in range(EPOCHS):
        batches = []
        for x, y, index in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            batches.append(index.tolist())
        epochs.append({"batches": batches, **states(generator)})
    weights = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    return {"epochs": epochs, "weights": weights}


def compare_job(names: list[str]) -> dict:
    """Per case: this process's plain run (as if alone) and its prepared run."""
    accelerator = Accelerator()
    rank, count = accelerator.process_index, accelerator.num_processes
    return {
        name: {
            "plain": train_plain(CASES[name], rank, count),
            "prepared": train_prepared(accelerator, CASES[name], rank),
        }
        for name in names
    }
