"""What every prepared dataloader shares: end-of-epoch signalling, epochs, and resume state."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Sized
from typing import Any, Protocol

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from accel_data.errors import ResumeStateError
from accel_data.iterable import IterableDatasetShard
from accel_data.random_order import GlobalSeedRandomSampler, SeedDraw, peek_seed
from accel_data.samplers import (
    BatchSamplerShard,
    SeedableRandomSampler,
    SkipOnceBatchSampler,
    propagate_epoch,
    sampler_chain,
)
from accel_state.gradient_state import GradientState

# Arguments that describe how a DataLoader batches; the helpers rebuild those themselves.
BATCHING_ARGUMENTS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
STATE_KEYS = (
    "epoch",
    "batches_yielded",
    "num_processes",
    "generator_state",
    "data_seed",
    "base_rng_state",
)


def dataloader_kwargs(dataloader: DataLoader[Any]) -> dict[str, Any]:
    """The keyword arguments ``dataloader`` was built with, batching arguments excluded.

    Read from the installed torch's ``DataLoader`` signature, so new arguments are carried over.
    """
    kwargs: dict[str, Any] = {}
    for name, parameter in inspect.signature(DataLoader.__init__).parameters.items():
        if name == "self" or name in BATCHING_ARGUMENTS or parameter.kind is parameter.VAR_KEYWORD:
            continue
        if hasattr(dataloader, name):
            kwargs[name] = getattr(dataloader, name)
    if not kwargs.get("num_workers"):
        kwargs.pop("prefetch_factor", None)
        kwargs.pop("persistent_workers", None)
    return kwargs


class FetchObserver(Protocol):
    """Told when a prepared loader starts and finishes producing a batch (accel's slow-rank report).

    The time between the two calls is the loader's share of the step: reading, collating and
    moving the batch, after the training loop asked for it.
    """

    def fetch_started(self) -> None:
        """The loop asked for the next batch."""

    def fetch_finished(self) -> None:
        """The batch is ready and about to be handed to the loop."""


@dataclasses.dataclass
class ResumePoint:
    """Where a loaded mid-epoch state asks the next iteration to start (in that epoch).

    A state saved between epochs needs none: the next iteration is an ordinary epoch start,
    drawing from the generators as the uninterrupted run did after its save.
    """

    batches: int
    base_rng_state: torch.Tensor | None
    #: Elastic resume (another number of processes): samples of the epoch's global order
    #: already consumed; the next iteration starts right after them.
    samples: int = 0


# Samplers whose order is the same whatever the number of processes (a seeded permutation of the
# whole dataset, or none): a mid-epoch state saved on N processes can resume on M.
_ELASTIC_SAMPLERS = (SequentialSampler, SeedableRandomSampler, GlobalSeedRandomSampler)

_STATEFUL_VARIANTS: dict[type, type] = {}


def stateful_dataloader_class() -> type | None:
    """Torchdata's ``StatefulDataLoader`` class, or ``None`` when torchdata lacks it."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return None
    return StatefulDataLoader  # type: ignore[no-any-return]


def stateful_variant(cls: type) -> type:
    """``cls`` also deriving from torchdata's ``StatefulDataLoader`` (``cls`` without torchdata).

    Accelerate's loaders made with ``use_stateful_dataloader=True`` are ``StatefulDataLoader``
    instances, which code checks with ``isinstance``. The variant iterates, checkpoints and
    resumes as ``cls`` does: its own ``state_dict`` comes first in the method order.
    """
    stateful = stateful_dataloader_class()
    if stateful is None or issubclass(cls, stateful):
        return cls
    variant = _STATEFUL_VARIANTS.get(cls)
    if variant is None:
        variant = type(cls.__name__, (cls, stateful), {"__module__": cls.__module__})
        variant.__qualname__ = f"{cls.__qualname__}.stateful"
        _STATEFUL_VARIANTS[cls] = variant
        cls.stateful = variant  # type: ignore[attr-defined]  # so that pickle finds it
    return variant


class _ItSelf:
    """A descriptor giving the instance itself (the class has no such attribute, as in Accelerate)."""

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            raise AttributeError("base_dataloader is an attribute of dataloader instances")
        return instance


class DataLoaderStateMixin:
    """End-of-epoch signalling into ``GradientState``, the epoch counter, and exact resume.

    Subclasses (which are also ``DataLoader`` subclasses) call :meth:`begin` when an iteration
    starts, :meth:`signal_last_batch` just before yielding its last batch, and :meth:`end` when
    it stops.

    Attributes:
        end_of_dataloader: Whether the batch just yielded is the last of the epoch.
        remainder: Real samples in the last round of the epoch (0: none duplicated; -1: unknown).
        iteration: The epoch in progress (or the next one).

    """

    dataset: Any
    batch_sampler: Any
    sampler: Any
    num_workers: int
    generator: torch.Generator | None
    end_of_dataloader: bool = False
    remainder: int = -1
    iteration: int = 0
    synchronized_generator: torch.Generator | None = None
    _drop_last: bool = False
    _batches_yielded: int = 0
    _pending_drop: int = 0
    _in_epoch: bool = False
    _resume: ResumePoint | None = None
    _skip_once: SkipOnceBatchSampler | None = None
    _epoch_generator_state: torch.Tensor | None = None
    _epoch_base_rng_state: torch.Tensor | None = None
    _sample_offset: int = 0  # samples of the epoch consumed before this run's batches (elastic)
    #: Told when each batch is asked for and ready (set by ``Accelerator.prepare``), or None.
    fetch_observer: FetchObserver | None = None

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> Any:
        """A ``StatefulDataLoader`` too when ``use_stateful_dataloader`` (and torchdata is there)."""
        if use_stateful_dataloader:
            cls = stateful_variant(cls)
        return super().__new__(cls)

    #: Accelerate's wrapped loader: accel's loaders are the ``DataLoader`` themselves.
    base_dataloader = _ItSelf()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the fetch observer (it belongs to this process's Accelerator)."""
        state = self.__dict__.copy()
        state.pop("fetch_observer", None)
        return state

    def _fetch_started(self) -> None:
        if self.fetch_observer is not None:
            self.fetch_observer.fetch_started()

    def _fetch_finished(self) -> None:
        if self.fetch_observer is not None:
            self.fetch_observer.fetch_finished()

    # ------------------------------------------------------------------ GradientState
    @property
    def gradient_state(self) -> GradientState:
        """The process's :class:`~accel_state.GradientState` (Accelerate's attribute)."""
        return GradientState()

    def reset(self) -> None:
        """Clear the end-of-dataloader flag and the remainder."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Register with ``GradientState`` at the start of an iteration."""
        self.reset()
        self.remainder = self._expected_remainder()
        gradient_state = GradientState()
        gradient_state.add_dataloader(self)
        gradient_state.set_remainder(self.remainder)

    def signal_last_batch(self, remainder: int) -> None:
        """Mark the batch about to be yielded as the last of the epoch."""
        self.end_of_dataloader = True
        self.remainder = remainder
        gradient_state = GradientState()
        gradient_state.set_end_of_dataloader(True)
        gradient_state.set_remainder(remainder)

    def end(self) -> None:
        """Unregister from ``GradientState``; an enclosing prepared dataloader becomes active again."""
        gradient_state = GradientState()
        gradient_state.remove_dataloader(self)
        active = gradient_state.active_dataloader
        if active is not None:
            gradient_state.set_end_of_dataloader(bool(getattr(active, "end_of_dataloader", False)))
            gradient_state.set_remainder(int(getattr(active, "remainder", -1)))

    @property
    def total_batch_size(self) -> int | None:
        """Samples consumed from the dataset per step of the whole job (``None``: unknown)."""
        if isinstance(self.dataset, IterableDatasetShard):
            return self.dataset.round_size
        for node in sampler_chain(self._own_batch_sampler()):
            if isinstance(node, BatchSamplerShard):
                if node.batch_size is None:
                    return None
                return node.batch_size * (1 if node.split_batches else node.num_processes)
        return getattr(self._own_batch_sampler(), "batch_size", None)

    @property
    def total_dataset_length(self) -> int:
        """Samples drawn per epoch before sharding (the sampler's length, else the dataset's)."""
        dataset = self.dataset
        if isinstance(dataset, IterableDatasetShard):
            dataset = dataset.dataset
        for node in reversed(sampler_chain(self._own_batch_sampler())):
            sampler = getattr(node, "sampler", None)
            if isinstance(sampler, Sized) and not hasattr(sampler, "batch_size"):
                return len(sampler)
        return len(dataset)

    def _own_batch_sampler(self) -> Any:
        """The batch sampler this loader draws index lists from (``None`` for iterable datasets)."""
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def _expected_remainder(self) -> int:
        if self._drop_last:
            return -1
        total = self.total_batch_size
        if not total:
            return -1
        try:
            return self.total_dataset_length % total
        except TypeError:
            return -1

    def _measured_remainder(self) -> int:
        """The remainder the sharding sampler or dataset observed, else the expected one."""
        if self._drop_last:
            return -1
        measured = -1
        if isinstance(self.dataset, IterableDatasetShard) and self.num_workers == 0:
            measured = self.dataset.remainder
        for node in sampler_chain(self._own_batch_sampler()):
            if isinstance(node, BatchSamplerShard):
                measured = node.remainder
        return measured if measured >= 0 else self.remainder

    # ------------------------------------------------------------------ epochs
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: samplers and datasets with ``set_epoch`` reshuffle accordingly."""
        self.iteration = epoch
        propagate_epoch(self._own_batch_sampler(), self.dataset, epoch)

    def _open_epoch(self, resume: ResumePoint | None) -> None:
        """Start an iteration: epoch, generator states, position, ``GradientState`` registration."""
        self._start_generators(fresh=resume is None)
        self.set_epoch(self.iteration)
        self._capture_epoch_start(resume)
        self._batches_yielded = 0 if resume is None else resume.batches
        self._sample_offset = 0 if resume is None else resume.samples
        self._in_epoch = True
        self.begin()

    def _complete_epoch(self) -> None:
        """After the last batch: the next iteration is the next epoch, from its start."""
        self.iteration += 1
        self._batches_yielded = 0
        self._sample_offset = 0

    def _close_epoch(self) -> None:
        """However the iteration ended (exhausted, broken off, raised): unregister it."""
        self._in_epoch = False
        self.end()

    def _start_generators(self, fresh: bool) -> None:
        """Prepare the shuffle of the epoch about to start (``fresh``: not a resumed one).

        A :class:`GlobalSeedRandomSampler` gets its seed now: the one its iteration would draw
        from torch's global generator after the iterator's base seed, so the order is plain
        PyTorch's; the iteration then only consumes that draw. A resumed epoch draws nothing:
        its generator state comes from the checkpoint, and the global generator is already past
        the draw. Subclasses synchronise generators around this.
        """
        sampler = self._global_seed_sampler()
        if sampler is None:
            return
        if not fresh:
            sampler.seed_draw = SeedDraw.SKIP
            return
        sampler.generator.manual_seed(peek_seed(skip=self._base_seed_draws()))
        sampler.seed_draw = SeedDraw.DISCARD

    def _base_seed_draws(self) -> int:
        """Draws from torch's global generator when this epoch's iterator is created (0 or 1)."""
        reused = self.num_workers > 0 and getattr(self, "_iterator", None) is not None
        return 0 if reused or self.generator is not None else 1

    def _global_seed_sampler(self) -> GlobalSeedRandomSampler | None:
        for node in sampler_chain(self._own_batch_sampler()):
            if isinstance(node, GlobalSeedRandomSampler):
                return node
        return None

    def _seedable_sampler(self) -> SeedableRandomSampler | None:
        for node in sampler_chain(self._own_batch_sampler()):
            if isinstance(node, SeedableRandomSampler):
                return node
        return None

    # ------------------------------------------------------------------ resume
    def _reposition_resume(self, batches: int) -> bool:
        """Start the pending resumed epoch at batch ``batches`` instead; whether one is pending.

        A loaded mid-epoch state is pending until the next iteration starts. ``batches`` counts
        from the start of that epoch, as ``skip_first_batches`` does.
        """
        if self._resume is None:
            return False
        self._resume = dataclasses.replace(self._resume, batches=batches)
        self._batches_yielded = batches
        return True

    def _take_resume(self) -> ResumePoint | None:
        resume, self._resume = self._resume, None
        return resume

    def _capture_epoch_start(self, resume: ResumePoint | None) -> None:
        """Remember the generators' states at the start of the epoch (after synchronisation)."""
        generator = self.synchronized_generator
        self._epoch_generator_state = generator.get_state() if generator is not None else None
        if resume is not None:
            self._epoch_base_rng_state = resume.base_rng_state
        elif self.num_workers > 0 and self.generator is None:
            # Worker seeds are drawn from the global generator when the iterator is created.
            self._epoch_base_rng_state = torch.get_rng_state()
        else:
            self._epoch_base_rng_state = None

    def _create_base_iterator(
        self, resume: ResumePoint | None, can_skip: bool, keep_first: int = 0
    ) -> Iterator[Any]:
        """``DataLoader.__iter__``; when resuming, skip the consumed batches without loading them.

        The first ``keep_first`` batches of the epoch are yielded anyway. Batches that cannot be
        skipped by index (iterable datasets, live persistent workers) are left in
        :attr:`_pending_drop` for the caller to read and drop after those.
        """
        self._pending_drop = 0
        skip = 0 if resume is None else resume.batches * self._base_batches_per_batch()
        if resume is not None and resume.samples:
            skip = self._start_after_samples(resume.samples)
        persistent = getattr(self, "_iterator", None) is not None
        if skip and can_skip and not persistent and self._own_batch_sampler() is not None:
            self._skip_once = SkipOnceBatchSampler(self._own_batch_sampler(), skip, keep_first)
        else:
            self._pending_drop = max(skip - keep_first, 0)
        # Creating a DataLoader iterator draws its base seed from torch's global generator. An
        # interrupted run drew it at the start of the epoch, before its mid-epoch state was
        # saved, so a resumed iteration must leave the restored global generator untouched (and
        # reproduce the same worker seeds when the epoch-start state is known). A state saved
        # between epochs resumes as an ordinary epoch (no ``resume``), which draws it.
        saved_rng = torch.get_rng_state() if resume is not None else None
        if resume is not None and resume.base_rng_state is not None:
            torch.set_rng_state(resume.base_rng_state)
        try:
            return DataLoader.__iter__(self)  # type: ignore[arg-type]
        finally:
            self._skip_once = None
            if saved_rng is not None:
                torch.set_rng_state(saved_rng)

    def _start_after_samples(self, samples: int) -> int:
        """Elastic resume: start the global order after ``samples``; batches left to skip here.

        With a :class:`BatchSamplerShard` its next iteration deals out the rest of the order
        among this job's processes; a single process's plain batch sampler skips whole batches.
        """
        for node in sampler_chain(self._own_batch_sampler()):
            if isinstance(node, BatchSamplerShard):
                node.start_after_samples(samples)
                return 0
        size = getattr(self._own_batch_sampler(), "batch_size", None) or 1
        return samples // size

    def _elastic_order(self) -> str | None:
        """Why this loader's order depends on the number of processes (``None``: it does not).

        The order is process-count independent when a map-style dataset is drawn by a plain
        ``BatchSampler`` over a sequential or seeded random sampler (the whole dataset's
        permutation), which :class:`BatchSamplerShard` then splits among the processes.
        """
        if isinstance(self.dataset, IterableDataset):
            return (
                "its dataset is iterable, sharded by process (each process reads its own part of "
                "the stream)"
            )
        if self._base_batches_per_batch() != 1:
            return "it dispatches batches from process 0 (dispatch_batches=True)"
        batch_sampler = self._own_batch_sampler()
        shard = next(
            (n for n in sampler_chain(batch_sampler) if isinstance(n, BatchSamplerShard)), None
        )
        inner = shard.batch_sampler if shard is not None else batch_sampler
        if type(inner) is not BatchSampler or inner.batch_size is None:
            return f"its batch sampler ({type(inner).__name__}) is not a plain BatchSampler"
        if type(inner.sampler) not in _ELASTIC_SAMPLERS:
            return (
                f"its sampler ({type(inner.sampler).__name__}) is not one whose order is known "
                "not to depend on the process (SequentialSampler or a seeded RandomSampler)"
            )
        return None

    def _samples_consumed(self) -> int | None:
        """Samples of this epoch's global order consumed by the whole job (``None``: unknown)."""
        total = self.total_batch_size
        if total is None or self._elastic_order() is not None:
            return None
        return self._sample_offset + self._batches_yielded * total

    def _base_batches_per_batch(self) -> int:
        """How many batches of the underlying ``DataLoader`` make one batch of this loader."""
        return 1

    @property
    def _index_sampler(self) -> Any:
        # torch's DataLoader iterators draw indices from this property; while a resumed
        # iterator is being created it is the one-shot skipping wrapper.
        if self._skip_once is not None:
            return self._skip_once
        return self._own_batch_sampler()

    def _num_processes_for_state(self) -> int:
        return 1

    def state_dict(self) -> dict[str, Any]:
        """Where this dataloader stands: epoch, batches handed out in it, generator states.

        Holds only ints and tensors (no pickled objects). Load it into a dataloader prepared the
        same way (in a fresh process, say) with :meth:`load_state_dict` to continue exactly.
        """
        mid_epoch = self._in_epoch or self._batches_yielded > 0
        generator = self.synchronized_generator
        if mid_epoch:
            generator_state = self._epoch_generator_state
            base_rng_state = self._epoch_base_rng_state
        else:
            generator_state = generator.get_state() if generator is not None else None
            base_rng_state = None
        seedable = self._seedable_sampler()
        return {
            "epoch": int(self.iteration),
            "batches_yielded": int(self._batches_yielded),
            "num_processes": self._num_processes_for_state(),
            "generator_state": None if generator_state is None else generator_state.clone(),
            "data_seed": None if seedable is None else int(seedable.initial_seed),
            "base_rng_state": None if base_rng_state is None else base_rng_state.clone(),
            # Elastic resume: where the epoch's process-independent global order stands (None
            # when the order depends on the processes); sample_offset > 0 after such a resume.
            "samples_consumed": self._samples_consumed(),
            "sample_offset": int(self._sample_offset),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`: the next iteration starts where that one stopped.

        Raises:
            ResumeStateError: Missing keys, wrong types, or a mid-epoch state saved with another
                number of processes.

        """
        missing = [key for key in STATE_KEYS if key not in state_dict]
        if missing:
            raise ResumeStateError(
                f"load_state_dict: the state lacks {missing}; pass the dictionary returned by "
                "state_dict() of a prepared dataloader."
            )
        epoch, batches = state_dict["epoch"], state_dict["batches_yielded"]
        for name, value in (("epoch", epoch), ("batches_yielded", batches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ResumeStateError(
                    f"load_state_dict: {name}={value!r} must be an int >= 0; the state is corrupt."
                )
        saved_processes = state_dict["num_processes"]
        samples = 0
        if (batches or state_dict.get("sample_offset")) and (
            saved_processes != self._num_processes_for_state() or state_dict.get("sample_offset")
        ):
            samples = self._elastic_samples(state_dict, saved_processes)
        generator_state = state_dict["generator_state"]
        generator = self.synchronized_generator
        if generator_state is not None and generator is not None:
            generator.set_state(generator_state)
        seedable = self._seedable_sampler()
        if seedable is not None and state_dict["data_seed"] is not None:
            seedable.initial_seed = int(state_dict["data_seed"])
        self.iteration = epoch
        self._batches_yielded = 0 if samples else batches
        self._sample_offset = samples
        self._in_epoch = False
        self._resume = None
        if batches or samples:
            self._epoch_generator_state = generator_state
            self._epoch_base_rng_state = state_dict["base_rng_state"]
            self._resume = ResumePoint(
                0 if samples else batches, state_dict["base_rng_state"], samples
            )

    def _elastic_samples(self, state_dict: dict[str, Any], saved_processes: Any) -> int:
        """Samples already consumed, for a mid-epoch state saved with another process count.

        Raises:
            ResumeStateError: The saved or this loader's order depends on the number of
                processes, or the consumed samples do not end on a batch of this loader.
        """
        here = self._num_processes_for_state()
        batches = state_dict["batches_yielded"]
        samples = state_dict.get("samples_consumed")
        head = (
            f"load_state_dict: the state was saved mid-epoch (batches_yielded={batches}) with "
            f"num_processes={saved_processes}, this dataloader runs with num_processes={here}"
        )
        why = self._elastic_order()
        if samples is None or why is not None:
            reason = why or (
                "the state does not record the samples consumed (the saving dataloader's order "
                "depended on its number of processes, or an older accel saved it)"
            )
            raise ResumeStateError(
                f"{head}, and the samples left cannot be found: {reason}. Resume with "
                f"num_processes={saved_processes}, or from a state saved between epochs; for "
                "elastic resumes use a map-style dataset with shuffle=True or False and no custom "
                "sampler (its order is then a seeded permutation of the whole dataset, split "
                "among the processes)."
            )
        valid = isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0
        if not valid or (batches and not samples):
            raise ResumeStateError(
                f"{head}: samples_consumed={samples!r} does not fit; the state is corrupt. "
                "Resume from another checkpoint, or from one saved between epochs."
            )
        unit = self._elastic_unit()
        if samples % unit:
            raise ResumeStateError(
                f"{head}: samples_consumed={samples} is not a whole number of batches of "
                f"{unit} samples here. Resume with a per-process batch size that divides "
                f"{samples}, or from a state saved between epochs."
            )
        return int(samples)

    def _elastic_unit(self) -> int:
        """Samples in one batch of the order before it is split among processes."""
        for node in sampler_chain(self._own_batch_sampler()):
            if isinstance(node, BatchSamplerShard):
                return node.batch_size or 1
        return int(getattr(self._own_batch_sampler(), "batch_size", None) or 1)
