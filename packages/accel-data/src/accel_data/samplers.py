"""Samplers: seedable shuffling, batch-sampler sharding across processes, skipping batches."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from accel_data.errors import BatchSizeError, DataConfigurationError
from accel_data.random_order import GlobalSeedRandomSampler, random_sampler_indices


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on a seed and the epoch.

    Each iteration reseeds the generator with ``initial_seed + epoch``, so every process (and every
    resumed run) that agrees on the seed and the epoch draws the same permutation. The epoch
    advances by one after each complete iteration; :meth:`set_epoch` sets it.

    Args:
        data_source: The dataset.
        replacement: Draw with replacement.
        num_samples: Number of indices per epoch (default: the dataset length).
        generator: Generator to reseed (default: a new one).
        data_seed: The seed (default: torch's initial seed of this process).

    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(
            data_source,  # type: ignore[arg-type]
            replacement=replacement,
            num_samples=num_samples,
            generator=generator,
        )
        self.initial_seed = int(data_seed if data_seed is not None else torch.initial_seed())
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the permutation of the next iteration."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed((self.initial_seed + self.epoch) % 2**64)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)


def _check_shard(num_processes: int, process_index: int) -> None:
    if num_processes < 1:
        raise DataConfigurationError(
            f"num_processes={num_processes} must be at least 1; leave it None to use "
            "PartialState().num_processes."
        )
    if not 0 <= process_index < num_processes:
        raise DataConfigurationError(
            f"process_index={process_index} is not a process of a {num_processes}-process job; "
            f"use 0 to {num_processes - 1}, or leave it None to use PartialState().process_index."
        )


def check_split_batch_size(batch_size: int | None, num_processes: int, where: str) -> None:
    """Raise unless ``batch_size`` can be split into ``num_processes`` equal parts.

    Raises:
        BatchSizeError: ``batch_size`` is unknown or not a multiple of ``num_processes``.

    """
    if batch_size is None:
        raise BatchSizeError(
            f"split_batches=True needs a fixed batch size, but {where} has batch_size=None (a "
            "batch sampler without a batch_size attribute). Give the batch sampler a batch_size "
            "attribute, or use split_batches=False."
        )
    if batch_size % num_processes != 0:
        raise BatchSizeError(
            f"split_batches=True splits each batch between the processes, but batch_size="
            f"{batch_size} ({where}) is not a round multiple of num_processes={num_processes}. Use a "
            f"batch size divisible by {num_processes} (e.g. "
            f"{max(num_processes, batch_size // num_processes * num_processes)}), or "
            "split_batches=False."
        )


def _cut_end(indices: list[int], batch_size: int, drop_last: bool) -> int:
    """Where ``BatchSampler`` stops cutting ``indices`` into batches (exclusive)."""
    return len(indices) - len(indices) % batch_size if drop_last else len(indices)


def _cycle_samples(batches: list[list[Any]]) -> Iterator[Any]:
    """The samples of ``batches`` in order, repeated forever (for wrapping around)."""
    return itertools.cycle([sample for batch in batches for sample in batch])


class BatchSamplerShard(BatchSampler):
    """Shard a batch sampler: each process takes whole batches in turn, or a slice of every batch.

    With ``split_batches=False`` process ``i`` takes batches ``i, i + n, i + 2n, ...`` of the
    wrapped sampler (``n`` processes), so one step of the job consumes ``n`` batches. With
    ``split_batches=True`` every process takes its ``1/n`` slice of each batch.

    With ``even_batches=True`` (and ``drop_last=False``) the last round is completed with samples
    from the start of the epoch so every process gets the same number of batches of the same
    size; :attr:`remainder` then says how many samples of that last round are real. Batch samplers
    without a ``batch_size`` attribute (variable batch sizes) are completed with whole batches.

    Args:
        batch_sampler: The sampler to shard; yields lists of indices.
        num_processes: Number of processes.
        process_index: This process's index.
        split_batches: Split every batch instead of dealing whole batches.
        even_batches: Wrap around so every process gets the same number of batches.

    Raises:
        BatchSizeError: ``split_batches=True`` with a batch size not divisible by
            ``num_processes``, or an unknown batch size.
        DataConfigurationError: ``process_index`` or ``num_processes`` out of range.

    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        _check_shard(num_processes, process_index)
        batch_size = getattr(batch_sampler, "batch_size", None)
        if split_batches:
            check_split_batch_size(batch_size, num_processes, type(batch_sampler).__name__)
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = batch_size  # type: ignore[assignment]
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        self.sampler = getattr(batch_sampler, "sampler", None)  # type: ignore[assignment]
        #: Real samples in the last round of the latest complete iteration (0: the round was
        #: full, -1: unknown or dropped). ``len(data) % total_batch_size`` for fixed batch sizes.
        self.remainder = -1
        self._start_batch = 0  # next iteration only: batches of the wrapped sampler to pass

    def start_after_samples(self, samples: int) -> None:
        """Begin the next iteration after the first ``samples`` of the wrapped sampler's order.

        For elastic resumes: the rest of the epoch's order is dealt out among this job's
        processes as in an epoch that began there (the last round is completed from the epoch's
        first samples, as usual). ``samples`` must be a whole number of the wrapped batches.

        Raises:
            DataConfigurationError: ``samples`` is negative or not a multiple of the batch size,
                or the wrapped batch sampler is not a plain ``BatchSampler``.
        """
        size = self.batch_size
        plain = type(self.batch_sampler) is BatchSampler  # checked without drawing an order
        if size is None or samples < 0 or samples % size or not plain:
            raise DataConfigurationError(
                f"start_after_samples(samples={samples}) needs a plain BatchSampler with a fixed "
                f"batch size dividing it (this one: {type(self.batch_sampler).__name__}, "
                f"batch_size={size})."
            )
        self._start_batch = samples // size

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped batch sampler."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __len__(self) -> int:
        total = self.total_length
        n, rank = self.num_processes, self.process_index
        if self.split_batches:
            if self.even_batches or self.drop_last:
                return total
            last = self._last_batch_size()
            piece = (self.batch_size or 1) // n
            return total - 1 if last is not None and last <= rank * piece else total
        if self.drop_last:
            return total // n
        if self.even_batches:
            return math.ceil(total / n)
        return total // n + (1 if rank < total % n else 0)

    def _last_batch_size(self) -> int | None:
        """Size of the short last batch when it can be known without iterating (``None`` if full)."""
        sampler = self.sampler
        if self.batch_size is None or not isinstance(sampler, Sized):
            return None
        last = len(sampler) % self.batch_size
        return last or None

    def __iter__(self) -> Iterator[list[int]]:
        # A generator, like BatchSampler's: nothing is drawn until the first batch is asked for.
        self.remainder = -1
        yield from self._iter_split() if self.split_batches else self._iter_whole()

    def _plain_indices(self) -> list[int] | None:
        """For a plain ``BatchSampler``, every index of the epoch in order (else ``None``).

        Cutting batches out of this list gives what iterating the batch sampler gives (and
        draws the same random numbers), without building every other process's batch one index
        at a time in Python.
        """
        batch_sampler = self.batch_sampler
        if type(batch_sampler) is not BatchSampler:
            return None
        sampler = batch_sampler.sampler
        if type(sampler) is GlobalSeedRandomSampler:
            return sampler.indices()
        if type(sampler) is RandomSampler and sampler.generator is not None:
            return random_sampler_indices(sampler)
        return list(sampler)

    def _is_full(self, batch: list[int]) -> bool:
        return self.batch_size is None or len(batch) == self.batch_size

    def _iter_whole(self) -> Iterator[list[int]]:
        indices = self._plain_indices()
        if indices is not None:
            return self._iter_whole_plain(indices)
        return self._iter_whole_any()

    def _iter_whole_plain(self, indices: list[int]) -> Iterator[list[int]]:
        """:meth:`_iter_whole_any` for batches cut from one index list: only ours are built."""
        n, rank, size = self.num_processes, self.process_index, self.batch_size or 1
        first, self._start_batch = self._start_batch, 0
        batches = len(indices) // size if self.drop_last else -(-len(indices) // size)
        first = min(first, batches)
        left = batches - first
        short_last = not self.drop_last and len(indices) % size != 0
        clean_rounds = left // n - (1 if short_last and left % n == 0 else 0)
        for step in range(clean_rounds):
            start = (first + step * n + rank) * size
            yield indices[start : start + size]
        tail = [
            indices[k * size : (k + 1) * size] for k in range(first + clean_rounds * n, batches)
        ]
        head = [indices[k * size : (k + 1) * size] for k in range(min(n, batches))]
        yield from self._last_round(tail, head)

    def _iter_whole_any(self) -> Iterator[list[int]]:
        n, rank = self.num_processes, self.process_index
        keep_head = self.even_batches and not self.drop_last
        head: list[list[int]] = []
        current: list[list[int]] = []
        held: list[list[int]] | None = None  # a round ending in a short batch, maybe the tail
        for batch in self.batch_sampler:
            if held is not None:  # the short batch was not the last one: release its round
                yield held[rank]
                held = None
            if keep_head and len(head) < n:
                head.append(batch)
            current.append(batch)
            if len(current) == n:
                if self._is_full(batch):
                    yield current[rank]
                else:
                    held = current
                current = []
        yield from self._last_round(held if held is not None else current, head)

    def _last_round(self, tail: list[list[int]], head: list[list[int]]) -> Iterator[list[int]]:
        """This process's batch of the incomplete last round ``tail``, and the remainder."""
        if not tail:
            self.remainder = -1 if self.drop_last else 0
            return
        if self.drop_last:  # an incomplete round of full batches is dropped on every process
            return
        real = sum(len(batch) for batch in tail)
        if self.even_batches:
            tail = self._complete_round(tail, head)
        self.remainder = real
        if self.process_index < len(tail):
            yield tail[self.process_index]

    def _complete_round(self, tail: list[list[int]], head: list[list[int]]) -> list[list[int]]:
        """Fill the last round up to ``num_processes`` full batches, wrapping around to ``head``."""
        tail = list(tail)
        if self.batch_size is None:  # variable batch sizes: repeat whole batches from the start
            batches = itertools.cycle(head)
            while len(tail) < self.num_processes:
                tail.append(list(next(batches)))
            return tail
        samples = _cycle_samples(head)
        size = self.batch_size
        if len(tail[-1]) < size:
            last = list(tail[-1])
            tail[-1] = last + list(itertools.islice(samples, size - len(last)))
        while len(tail) < self.num_processes:
            tail.append(list(itertools.islice(samples, size)))
        return tail

    def _iter_split(self) -> Iterator[list[int]]:
        size = self.batch_size or 1
        piece = size // self.num_processes
        start, stop = self.process_index * piece, (self.process_index + 1) * piece
        first, self._start_batch = self._start_batch, 0
        head: list[int] | None = None
        last_real = 0
        indices = self._plain_indices()
        batches: Iterable[list[int]] = self.batch_sampler
        if indices is not None:
            head = indices[:size]  # the epoch's first batch completes a short last one
            batches = (
                indices[start : start + size]
                for start in range(first * size, _cut_end(indices, size, self.drop_last), size)
            )
        for batch in batches:
            if head is None:
                head = list(batch)
            if len(batch) == size:
                last_real = 0
                yield batch[start:stop]
                continue
            last_real = len(batch)
            if self.even_batches:
                filler = _cycle_samples([head])
                batch = list(batch) + list(itertools.islice(filler, size - len(batch)))
            part = batch[start:stop]
            if len(part) > 0:
                yield part
        self.remainder = -1 if self.drop_last else last_real


class SkipBatchSampler(BatchSampler):
    """A batch sampler that leaves out the first ``skip_batches`` batches of another one.

    The skipped batches' indices are drawn (so a shuffling sampler consumes its generator exactly
    as without skipping) but no sample is loaded.

    Args:
        batch_sampler: The batch sampler to wrap.
        skip_batches: Number of batches to leave out at the start of every iteration.

    """

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        if skip_batches < 0:
            raise DataConfigurationError(
                f"skip_batches={skip_batches} must be 0 or more (the number of batches to skip)."
            )
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)  # type: ignore[assignment]
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        self.sampler = getattr(batch_sampler, "sampler", None)  # type: ignore[assignment]

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped batch sampler, skipped ones included."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    def __len__(self) -> int:
        return max(self.total_length - self.skip_batches, 0)


class SkipOnceBatchSampler(SkipBatchSampler):
    """A :class:`SkipBatchSampler` that skips only in its next iteration (used to resume).

    Args:
        batch_sampler: The batch sampler to wrap.
        skip_batches: Number of batches to leave out in the next iteration.
        keep_first: Of those, how many at the very start to yield anyway (a dispatcher needs the
            epoch's first samples to complete its last step exactly as the interrupted run did).

    """

    def __init__(
        self, batch_sampler: Iterable[list[int]], skip_batches: int = 0, keep_first: int = 0
    ) -> None:
        super().__init__(batch_sampler, skip_batches)
        self.keep_first = keep_first

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the skip is used up by the iteration that actually starts (torch's
        # worker iterator calls iter() twice and only draws from the second one).
        skip, self.skip_batches = self.skip_batches, 0
        keep = min(self.keep_first, skip)
        iterator = iter(self.batch_sampler)
        yield from itertools.islice(iterator, keep)
        yield from itertools.islice(iterator, skip - keep, None)


def get_sampler(dataloader: DataLoader[Any]) -> Any:
    """The index sampler inside ``dataloader`` (the one a ``BatchSampler`` draws from), or ``None``."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)


def sampler_chain(batch_sampler: Any) -> list[Any]:
    """``batch_sampler`` and every sampler it wraps, outermost first."""
    chain: list[Any] = []
    node = batch_sampler
    while node is not None and all(node is not seen for seen in chain):
        chain.append(node)
        inner = getattr(node, "batch_sampler", None)
        node = inner if inner is not None else getattr(node, "sampler", None)
    return chain


def propagate_epoch(batch_sampler: Any, dataset: Any, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on every sampler in the chain and on the dataset that have one."""
    for node in sampler_chain(batch_sampler):
        set_epoch = getattr(node, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
    set_epoch = getattr(dataset, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
