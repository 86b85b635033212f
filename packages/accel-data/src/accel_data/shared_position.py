"""Batches taken at a position that several replica groups share (fault-tolerant training).

Under fault tolerance (accel's torchft support) several replica groups train one model; any of
them may die and come back. Each optimizer step is *committed* or not, for every group alike.
Here the samples of an epoch are a fixed order (a permutation drawn from a seed, or the dataset
order), and every step takes the next samples of that order after the *committed* position:

* the processes taking part in the step split the step's samples between them (``slot`` of
  ``slots``), so a dead group's share goes to the others;
* a step that is not committed hands out the same samples again at the next step;
* a group healed from a live peer copies the position and continues where the others are.

A step may span several batches (DiLoCo rounds: the samples of all of them are pending until
the round's sync); the quorum's ``close_round()`` is called when the epoch's samples are all
handed out. Over an epoch every sample is used in exactly one committed step. The quorum (which
processes take part, and whether a step committed) is not decided here: a :class:`StepQuorum`
says.

Example:
    >>> loader = SharedPositionLoader(DataLoader(dataset, batch_size=8), quorum, seed=0)
    >>> for batch in loader:  # this process's share of the next uncommitted samples
    ...     ...
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sized
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from accel_data.errors import DataConfigurationError, ResumeStateError
from accel_ops import send_to_device
from accel_state.gradient_state import GradientState


class StepQuorum(Protocol):
    """Who takes part in the optimizer step now open (the fault-tolerance manager)."""

    def open_step(self) -> tuple[int, int]:
        """``(slot, slots)``: this process's place among the step's processes (opens a step)."""
        ...  # pragma: no cover

    def serves_shared_position(self) -> bool:
        """Whether an iteration starting now is training (else it stays inside the group)."""
        ...  # pragma: no cover

    def close_round(self) -> None:
        """The epoch's samples are all handed out while some are pending: end the step now.

        A quorum whose steps span several batches (DiLoCo rounds) commits the samples there, or
        hands them out again; one whose step is one batch does nothing.
        """
        ...  # pragma: no cover


@dataclasses.dataclass
class SharedPosition:
    """Where the job stands in its epochs; equal in every replica group after each step.

    Attributes:
        epoch: Epoch in progress.
        committed: Samples of the epoch's order used by committed steps.
        pending: Samples handed out in the step still open (all processes' shares).
        seed: Seed of the epoch orders (``None``: the dataset order).
    """

    epoch: int = 0
    committed: int = 0
    pending: int = 0
    seed: int | None = None

    def state_dict(self) -> dict[str, Any]:
        """The position as plain numbers (the open step's samples are not part of it)."""
        return {"epoch": self.epoch, "committed": self.committed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take over another group's (or a checkpoint's) position.

        Raises:
            ResumeStateError: ``state`` lacks one of the keys :meth:`state_dict` writes.
        """
        missing = {"epoch", "committed", "seed"} - set(state)
        if missing:
            raise ResumeStateError(
                f"shared position state {state!r} lacks {sorted(missing)}; pass what "
                "SharedPosition.state_dict() returned."
            )
        self.epoch = int(state["epoch"])
        self.committed = int(state["committed"])
        self.pending = 0
        self.seed = None if state["seed"] is None else int(state["seed"])


def share_bounds(start: int, taken: int, slot: int, slots: int) -> tuple[int, int]:
    """The part ``[begin, end)`` of the ``taken`` samples from ``start`` that ``slot`` uses.

    Shares differ by one sample at most; with fewer samples than slots some shares are empty.
    """
    return start + slot * taken // slots, start + (slot + 1) * taken // slots


def epoch_order(num_samples: int, epoch: int, seed: int | None) -> list[int]:
    """The epoch's sample order: a permutation drawn from ``seed + epoch``, or ``range``."""
    if seed is None:
        return list(range(num_samples))
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


class SharedPositionBatchSampler:
    """This process's indices for each batch, taken at the shared position of the epoch.

    Before each batch it asks the quorum for its slot (which may heal this group and move the
    position), hands out the next ``batch_size x slots`` samples of the order (fewer at the end
    of the epoch) and records them as pending. The epoch ends once the committed samples cover
    the order; the position then moves to the next epoch.

    Args:
        num_samples: Samples in the dataset.
        batch_size: Samples per process and batch.
        position: The shared position (one per training dataloader).
        quorum: Where slots come from.
    """

    def __init__(
        self, num_samples: int, batch_size: int, position: SharedPosition, quorum: StepQuorum
    ) -> None:
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.position = position
        self.quorum = quorum
        #: Whether the batch handed out last is the last of the epoch (if its step commits).
        self.last_batch = False
        #: ``(epoch, first, count)`` of the job's samples in the batch handed out last.
        self.last_step_samples: tuple[int, int, int] = (0, 0, 0)
        self._order: tuple[int, int | None, list[int]] | None = None

    def _order_of(self, epoch: int) -> list[int]:
        if self._order is None or self._order[:2] != (epoch, self.position.seed):
            order = epoch_order(self.num_samples, epoch, self.position.seed)
            self._order = (epoch, self.position.seed, order)
        return self._order[2]

    def _remaining(self) -> int:
        return self.num_samples - self.position.committed - self.position.pending

    def _finish_epoch(self) -> None:
        if self.position.pending == 0:  # else the open step may still fail and hand them out again
            self.position.epoch += 1
            self.position.committed = 0

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            if self._remaining() <= 0 and self.position.pending > 0:
                self.quorum.close_round()  # a round spanning batches ends with the epoch's samples
            if self._remaining() <= 0:
                self._finish_epoch()
                return
            slot, slots = self.quorum.open_step()  # may heal: the position can move here
            remaining = self._remaining()
            if remaining <= 0:
                self._finish_epoch()
                return
            order = self._order_of(self.position.epoch)
            start = self.position.committed + self.position.pending
            taken = min(self.batch_size * slots, remaining)
            begin, end = share_bounds(start, taken, slot, slots)
            # A share left empty by the epoch's last few samples repeats the epoch's last one.
            indices = order[begin:end] or [order[-1]]
            self.position.pending += taken
            self.last_batch = taken == remaining
            self.last_step_samples = (self.position.epoch, start, taken)
            yield indices

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)


class SharedPositionLoader:
    """A dataloader whose training iterations hand out batches by the shared position.

    An iteration that starts while :meth:`StepQuorum.serves_shared_position` is False (the
    models are in eval mode) is the ``in_group`` loader's: sharded inside this replica group,
    as any prepared dataloader. Batches are fetched in this process (``num_workers`` is not
    used for training iterations: workers would fetch before the step's quorum is known).

    Args:
        dataloader: The user's dataloader (map-style dataset).
        quorum: The fault-tolerance manager.
        in_group: The ordinary prepared dataloader, for evaluation.
        device: Where batches go (``None``: left where collate put them).
        seed: Seed of the epoch orders when ``dataloader`` shuffles (``None``: 0).
        job_processes: Processes of the whole job (all replica groups), for :meth:`__len__`.

    Raises:
        DataConfigurationError: An iterable dataset, or no batch size.
    """

    def __init__(
        self,
        dataloader: DataLoader[Any],
        quorum: StepQuorum,
        in_group: Any = None,
        device: torch.device | None = None,
        seed: int | None = 0,
        job_processes: int = 1,
    ) -> None:
        if isinstance(dataloader.dataset, IterableDataset) or not isinstance(
            dataloader.dataset, Sized
        ):
            raise DataConfigurationError(
                f"dataloader.dataset is {type(dataloader.dataset).__name__}, an iterable or "
                "unsized dataset; fault-tolerant training hands out samples by index so that "
                "no sample is lost or repeated when a replica group fails. Use a map-style "
                "dataset (with __len__ and __getitem__)."
            )
        if dataloader.batch_size is None:
            raise DataConfigurationError(
                "dataloader.batch_size is None (a custom batch_sampler); fault-tolerant "
                "training needs DataLoader(dataset, batch_size=...)."
            )
        shuffles = isinstance(dataloader.sampler, RandomSampler)
        self.dataset = dataloader.dataset
        self.batch_size: int = dataloader.batch_size
        self.collate_fn: Callable[[list[Any]], Any] = dataloader.collate_fn
        self.pin_memory = dataloader.pin_memory
        self.in_group = in_group
        self.device = device
        self.quorum = quorum
        self.job_processes = job_processes
        self.position = SharedPosition(seed=(seed or 0) if shuffles else None)
        self.batch_sampler = SharedPositionBatchSampler(
            len(self.dataset), self.batch_size, self.position, quorum
        )
        self.end_of_dataloader = False
        self.remainder = -1
        #: Training iterations this process has started (its own loop's epochs).
        self.iterations = 0

    # The open step ---------------------------------------------------------------------------
    def step_ended(self, committed: bool) -> None:
        """Commit the open step's samples, or hand them out again at the next step."""
        if committed:
            self.position.committed += self.position.pending
        self.position.pending = 0

    # Iteration --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if not self.quorum.serves_shared_position():
            if self.in_group is None:
                raise DataConfigurationError(
                    "this dataloader was iterated with the models in eval mode and has no "
                    "in-group loader to evaluate with; pass in_group."
                )
            yield from self.in_group
            return
        epoch_of_loop = self.iterations
        self.iterations += 1
        if epoch_of_loop < self.position.epoch:
            # This group was healed ahead of its own loop: the job did this epoch already.
            return
        loader = DataLoader(
            self.dataset,
            batch_sampler=self.batch_sampler,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
        )
        gradient_state = GradientState()
        self.end_of_dataloader, self.remainder = False, -1
        gradient_state.add_dataloader(self)
        try:
            for batch in loader:
                # A last batch whose step failed is followed by its samples again: not last.
                self.end_of_dataloader = self.batch_sampler.last_batch
                gradient_state.set_end_of_dataloader(self.end_of_dataloader)
                yield batch if self.device is None else send_to_device(batch, self.device)
        finally:
            gradient_state.remove_dataloader(self)

    def __len__(self) -> int:
        """Batches per epoch when every process of the job takes part."""
        return math.ceil(len(self.dataset) / (self.batch_size * self.job_processes))

    @property
    def total_batch_size(self) -> int:
        """Samples per step when every process of the job takes part."""
        return self.batch_size * self.job_processes

    @property
    def iteration(self) -> int:
        """The job's epoch in progress (after ``load_state``: the epoch to resume)."""
        return self.position.epoch

    def set_epoch(self, epoch: int) -> None:
        """Accepted for compatibility: the epoch is the shared position's."""

    # Checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The shared position, for ``save_state``."""
        return {"shared_position": self.position.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; the script's loop is taken to start at its epoch.

        Raises:
            ResumeStateError: ``state`` was not written by a shared-position loader.
        """
        if "shared_position" not in state:
            raise ResumeStateError(
                f"dataloader state with keys {sorted(state)} was saved without fault "
                "tolerance; resume a fault-tolerant job from a checkpoint saved with it."
            )
        self.position.load_state_dict(state["shared_position"])
        self.iterations = self.position.epoch
