"""Shuffled orders drawn exactly as torch's ``RandomSampler`` draws them, generator calls included.

A prepared dataloader must leave every generator where plain PyTorch leaves it after each epoch,
or the next epoch (and everything else drawing from that generator) diverges from PyTorch. These
helpers reproduce ``RandomSampler.__iter__`` (checked against torch 2.13): the seed it draws from
torch's global generator when it has none, the ``randint`` chunks of 32 with replacement, and the
whole permutations without (the last one partly discarded, but always drawn).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import RandomSampler


def draw_seed(generator: torch.Generator | None = None) -> int:
    """One seed, drawn as torch's samplers and dataloader iterators draw it (global by default)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def peek_seed(skip: int = 0) -> int:
    """The seed :func:`draw_seed` would return after ``skip`` draws, leaving the generator alone."""
    state = torch.get_rng_state()
    try:
        for _ in range(skip):
            draw_seed()
        return draw_seed()
    finally:
        torch.set_rng_state(state)


def random_sampler_indices(sampler: RandomSampler) -> list[int]:
    """``list(sampler)`` for a ``RandomSampler`` with its own generator, drawn in bulk.

    Gives the order ``RandomSampler.__iter__`` gives and leaves the generator in the same state
    (tests check both), without its one-index-at-a-time Python generator. Like torch, it draws
    one more permutation than it uses in full, even when ``num_samples`` is a multiple of the
    dataset size (an exhausted ``RandomSampler`` has drawn it).
    """
    size, total, generator = len(sampler.data_source), sampler.num_samples, sampler.generator
    indices: list[int] = []
    if sampler.replacement:
        for _ in range(total // 32):
            indices += torch.randint(size, (32,), dtype=torch.int64, generator=generator).tolist()
        draw = torch.randint(size, (total % 32,), dtype=torch.int64, generator=generator)
        return indices + draw.tolist()
    for _ in range(total // size):
        indices += torch.randperm(size, generator=generator).tolist()
    return indices + torch.randperm(size, generator=generator).tolist()[: total % size]


class SeedDraw(enum.Enum):
    """What a :class:`GlobalSeedRandomSampler` does with torch's global generator next iteration."""

    RESEED = "reseed"  # draw a seed and shuffle with it (RandomSampler without a generator)
    DISCARD = "discard"  # draw a seed and drop it: the dataloader already seeded the generator
    SKIP = "skip"  # draw nothing: a resumed epoch whose seed was drawn before the checkpoint


class GlobalSeedRandomSampler(RandomSampler):
    """A ``RandomSampler`` without a user generator, as a prepared dataloader runs it.

    Like ``RandomSampler(generator=None)``, every iteration draws one seed from torch's global
    generator and shuffles with a generator seeded from it, so the order and the global
    generator's state follow plain PyTorch. The generator is kept in :attr:`generator`, so the
    dataloader can seed it with process 0's draw before the epoch (every process then shuffles
    the same way) and save or restore it for resuming; :attr:`seed_draw` says what the next
    iteration does (it returns to ``RESEED`` afterwards).

    Args:
        data_source: The dataset.
        replacement: Draw with replacement.
        num_samples: Number of indices per epoch (default: the dataset length).

    """

    generator: torch.Generator

    def __init__(
        self, data_source: Sized, replacement: bool = False, num_samples: int | None = None
    ) -> None:
        super().__init__(
            data_source,  # type: ignore[arg-type]
            replacement=replacement,
            num_samples=num_samples,
            generator=torch.Generator(),
        )
        self.seed_draw = SeedDraw.RESEED

    def indices(self) -> list[int]:
        """Draw this iteration's seed as torch does (see :attr:`seed_draw`), then every index."""
        mode, self.seed_draw = self.seed_draw, SeedDraw.RESEED
        if mode is not SeedDraw.SKIP:
            seed = draw_seed()
            if mode is SeedDraw.RESEED:
                self.generator.manual_seed(seed)
        return random_sampler_indices(self)

    def __iter__(self) -> Iterator[int]:
        # A generator, like RandomSampler's: nothing is drawn until the first index is asked for.
        yield from self.indices()
