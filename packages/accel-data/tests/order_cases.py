"""DataLoaders over every kind of sampler prepare_data_loader wraps, run next to plain PyTorch.

Each case is iterated twice from the same seeds: as plain PyTorch builds it, and prepared. What an
epoch yields and where it leaves the generators (the user's and torch's global one) is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from data_helpers import numbers, values
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler

from accel_data import prepare_data_loader, set_seed

SIZE = 50  # not a multiple of the batch sizes: every epoch ends with a short batch


class BlockShuffleSampler(Sampler[int]):
    """A custom sampler: blocks of consecutive indices in random order, some reversed."""

    def __init__(self, size: int, block: int, generator: torch.Generator | None = None) -> None:
        self.size, self.block, self.generator = size, block, generator

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.size // self.block, generator=self.generator).tolist()
        flips = (torch.rand(len(order), generator=self.generator) < 0.5).tolist()
        for start, flip in zip(order, flips, strict=True):
            block = list(range(start * self.block, (start + 1) * self.block))
            yield from reversed(block) if flip else block

    def __len__(self) -> int:
        return self.size // self.block * self.block


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

    build: Callable[[torch.Generator], DataLoader]
    sampler_uses_generator: bool


CASES: dict[str, Case] = {
    "shuffle_generator": Case(
        lambda g: DataLoader(numbers(SIZE), batch_size=4, shuffle=True, generator=g), True
    ),
    "shuffle": Case(lambda g: DataLoader(numbers(SIZE), batch_size=4, shuffle=True), False),
    "replacement": Case(
        lambda g: DataLoader(
            numbers(SIZE),
            batch_size=4,
            sampler=RandomSampler(numbers(SIZE), replacement=True, num_samples=70, generator=g),
        ),
        True,
    ),
    "replacement_global": Case(
        lambda g: DataLoader(
            numbers(SIZE),
            batch_size=4,
            sampler=RandomSampler(numbers(SIZE), replacement=True, num_samples=40),
        ),
        False,
    ),
    "num_samples": Case(  # a multiple of the size: the last permutation is drawn, none used
        lambda g: DataLoader(
            numbers(SIZE),
            batch_size=4,
            sampler=RandomSampler(numbers(SIZE), num_samples=2 * SIZE, generator=g),
        ),
        True,
    ),
    "num_samples_global": Case(
        lambda g: DataLoader(
            numbers(SIZE), batch_size=4, sampler=RandomSampler(numbers(SIZE), num_samples=60)
        ),
        False,
    ),
    "sampler_global_loader_generator": Case(  # the loader's base seed comes from g
        lambda g: DataLoader(
            numbers(SIZE), batch_size=4, sampler=RandomSampler(numbers(SIZE)), generator=g
        ),
        False,
    ),
    "sequential": Case(lambda g: DataLoader(numbers(SIZE), batch_size=4), False),
    "custom_sampler": Case(
        lambda g: DataLoader(
            numbers(SIZE), batch_size=4, sampler=BlockShuffleSampler(SIZE, 5, generator=g)
        ),
        True,
    ),
    "batch_sampler": Case(
        lambda g: DataLoader(
            numbers(SIZE),
            batch_sampler=BatchSampler(RandomSampler(numbers(SIZE), generator=g), 4, True),
        ),
        True,
    ),
    "batch_sampler_global": Case(
        lambda g: DataLoader(
            numbers(SIZE), batch_sampler=BatchSampler(RandomSampler(numbers(SIZE)), 3, False)
        ),
        False,
    ),
    "sampler_is_batch_sampler": Case(
        lambda g: DataLoader(
            numbers(SIZE),
            sampler=BatchSampler(RandomSampler(numbers(SIZE), generator=g), 4, False),
            batch_size=None,
        ),
        True,
    ),
    "custom_batch_sampler": Case(
        lambda g: DataLoader(numbers(SIZE), batch_sampler=ShuffledChunks(SIZE, 4, g)), True
    ),
}

#: Worker processes of the DataLoader (one process only: spawned test workers cannot fork them).
WORKER_CASES: dict[str, Case] = {
    "shuffle_workers": Case(
        lambda g: DataLoader(numbers(SIZE), batch_size=4, shuffle=True, num_workers=1), False
    ),
    "shuffle_persistent_workers": Case(
        lambda g: DataLoader(
            numbers(SIZE), batch_size=4, shuffle=True, num_workers=1, persistent_workers=True
        ),
        False,
    ),
}


def run_epochs(loader: DataLoader, epochs: int, generator: torch.Generator) -> list[dict]:
    """Per epoch: the batches' sample values, then the generators' states after it."""
    return [
        {
            "batches": [values(batch) for batch in loader],
            "generator": generator.get_state(),
            "torch": torch.get_rng_state(),
        }
        for _ in range(epochs)
    ]


def plain_and_prepared(case: Case, seed: int, epochs: int, **options: object) -> dict:
    """``case`` from the same seeds as plain PyTorch and prepared (``options`` go to prepare)."""
    set_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    plain = run_epochs(case.build(generator), epochs, generator)
    set_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    prepared = prepare_data_loader(case.build(generator), **options)  # type: ignore[arg-type]
    return {"plain": plain, "prepared": run_epochs(prepared, epochs, generator)}
