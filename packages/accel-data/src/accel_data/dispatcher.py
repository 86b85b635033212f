"""``DataLoaderDispatcher``: process 0 reads each batch and every process receives its slice."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel_data.errors import DispatchError
from accel_data.loader_base import DataLoaderStateMixin
from accel_data.samplers import check_split_batch_size
from accel_ops import (
    broadcast,
    broadcast_object_list,
    concatenate,
    find_batch_size,
    get_data_structure,
    initialize_tensors,
    recursively_apply,
    send_to_device,
)
from accel_ops.errors import AccelOpsError
from accel_state.partial_state import PartialState

_END: Any = object()
SliceFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Round:
    """One step as process 0 announces it to the others."""

    structure: Any  # the batch with every tensor replaced by its shape and dtype
    real: int  # samples read from the dataset for this step
    last: bool  # whether it is the epoch's last step


def slice_batch(
    batch: Any,
    tensor_slice: slice,
    process_index: int | None = None,
    num_processes: int | None = None,
) -> Any:
    """The default dispatch slice: every tensor of ``batch`` indexed by ``tensor_slice``.

    Other values (a string, a number...) are not per-sample data: every process gets them as
    they are, as Accelerate's dispatcher does. ``process_index`` and ``num_processes`` are part
    of the ``slice_fn`` signature and unused here.
    """
    return recursively_apply(_index_tensor, batch, tensor_slice)


def _index_tensor(tensor: torch.Tensor, tensor_slice: slice) -> torch.Tensor:
    return tensor[tensor_slice]


class DataLoaderDispatcher(DataLoaderStateMixin, DataLoader[Any]):
    """A ``DataLoader`` that only process 0 iterates; each process receives its slice of a batch.

    Each step, process 0 reads one batch per data-parallel shard (one with
    ``split_batches=True``), concatenates them, and broadcasts the result; every process keeps its
    slice (the processes of one tensor/context-parallel group of an N-D mesh keep the same one). A short last
    round is completed with the first samples of the epoch (``even_batches=True``), left uneven,
    or dropped (``drop_last=True``). Useful when reading is costly or the dataset cannot be
    sharded (streams).

    Args:
        dataset: The dataset, read on process 0 only.
        split_batches: Each batch of the dataloader is one step of the whole job, to split.
        skip_batches: Batches (of this loader) to leave out at the start of every iteration.
        use_stateful_dataloader: Accepted for Accelerate compatibility (state is built in).
        slice_fn: ``slice_fn(batch, slice, process_index=, num_processes=)`` cutting a batch;
            default :func:`slice_batch` (every tensor sliced, other values given to every
            process as they are, as in Accelerate).
        even_batches: Complete the last round with samples from the start of the epoch.
        synchronized_generator: The sampler's generator (its state goes into ``state_dict``).
        iteration: The epoch the first iteration starts (``set_epoch`` value), as in Accelerate.
        **kwargs: The ``DataLoader`` arguments.

    Raises:
        BatchSizeError: ``split_batches=True`` and the batch size is not a multiple of the number
            of processes.

    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: SliceFn | None = None,
        even_batches: bool = True,
        synchronized_generator: torch.Generator | None = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.state = PartialState()
        self.split_batches = split_batches
        self.skip_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader
        self.slice_fn: SliceFn = slice_batch if slice_fn is None else slice_fn
        self.even_batches = even_batches
        self.synchronized_generator = synchronized_generator
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.iteration = iteration
        if split_batches:
            check_split_batch_size(self._base_batch_size(), self._shards, "the dataloader")

    # ------------------------------------------------------------------ sizes
    def _base_batch_size(self) -> int | None:
        if self.batch_size is not None:
            return int(self.batch_size)
        return getattr(self._own_batch_sampler(), "batch_size", None)

    def _base_batches_per_batch(self) -> int:
        return 1 if self.split_batches else self._shards

    def _num_processes_for_state(self) -> int:
        return self._shards

    @property
    def _shards(self) -> int:
        """Slices of each step: the data-parallel ranks (every process without an N-D mesh)."""
        return self.state.data_parallel_size

    @property
    def _shard(self) -> int:
        """This process's slice (ranks of one tensor/context-parallel group share it)."""
        return self.state.data_parallel_process_index

    @property
    def total_batch_size(self) -> int | None:
        """Samples read per step of the whole job (``None``: unknown)."""
        size = self._base_batch_size()
        return None if size is None else size * self._base_batches_per_batch()

    def __len__(self) -> int:
        whole = super().__len__()
        n = self._shards
        if self.split_batches:
            length = whole
        elif self._drop_last:
            length = whole // n
        else:
            length = math.ceil(whole / n)
        if not self.even_batches and not self._drop_last:
            real = self._expected_remainder()
            if real > 0 and self._shard * math.ceil(real / n) >= real:
                length -= 1  # the uneven last round does not reach this process
        return max(length - self.skip_batches, 0)

    # ------------------------------------------------------------------ one round
    def _read_round(self, iterator: Iterator[Any]) -> tuple[Any, int] | str | None:
        """On process 0: the next step's batch and its size, None at the end, or an error text."""
        parts = []
        for _ in range(self._base_batches_per_batch()):
            batch = next(iterator, _END)
            if batch is _END:
                break
            parts.append(batch)
        if not parts or (self._drop_last and len(parts) < self._base_batches_per_batch()):
            return None
        try:
            batch = parts[0] if len(parts) == 1 else concatenate(parts)
            return batch, find_batch_size(batch)
        except (RuntimeError, AccelOpsError) as error:
            return (
                f"dispatch_batches=True could not join {len(parts)} batches on the main process "
                f"({error}). Batches of different shapes cannot be dispatched: pass "
                "split_batches=True (one batch per step, sliced), or dispatch_batches=False."
            )

    def _local_rounds(self, iterator: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
        """On process 0: each step read from ``iterator`` and whether it is the last one."""
        current = self._read_round(iterator)
        while current is not None:
            following = None if isinstance(current, str) else self._read_round(iterator)
            yield current, following is None
            current = following

    def _next_round(self, rounds: Iterator[tuple[Any, bool]] | None) -> tuple[Any, Round | None]:
        """Read the next step on process 0 and announce it (one object broadcast).

        Returns process 0's local batch (``None`` elsewhere) and the announced :class:`Round`
        (``None`` at the end). A reading failure on process 0 stops every process.
        """
        message: list[Round | str | None] = [None]
        local = None
        if rounds is not None:
            try:
                local, last = next(rounds, (None, True))
            except Exception as error:
                message[0] = (
                    f"Process 0 failed while reading the dataloader ({type(error).__name__}: "
                    f"{error}); its traceback has the cause."
                )
                with contextlib.suppress(Exception):
                    broadcast_object_list(message)
                raise
            if isinstance(local, str) or local is None:
                message[0] = local
            else:
                message[0] = Round(get_data_structure(local[0]), local[1], last)
        broadcast_object_list(message)
        announced = message[0]
        if isinstance(announced, str):
            raise DispatchError(announced)
        return local, announced

    def _materialize(self, local: Any, announced: Round) -> Any:
        device = self.state.device
        if self.state.process_index == 0:
            batch = send_to_device(local[0], device, non_blocking=self._non_blocking)
        else:
            batch = initialize_tensors(announced.structure, device=device)
        return recursively_apply(broadcast, batch)

    def _slice(self, batch: Any, section: slice) -> Any:
        try:
            return self.slice_fn(
                batch,
                section,
                process_index=self._shard,
                num_processes=self._shards,
            )
        except AccelOpsError as error:
            raise DispatchError(
                f"dispatch_batches=True could not slice a batch ({error}). Pass "
                "slice_fn_for_dispatch=<function(batch, slice, process_index, num_processes)> "
                "for batches holding other values than tensors."
            ) from error

    def _my_range(self, real: int) -> tuple[int, int, bool]:
        """This process's rows of a step of ``real`` samples, and whether padding is needed."""
        n = self._shards
        per = math.ceil(real / n)
        pad = bool(real % n) and self.even_batches and not self._drop_last
        start = self._shard * per
        return start, min(start + per, per * n if pad else real), pad

    def _uneven_tail(self) -> bool:
        """Whether the epoch's final step may leave some process without a batch."""
        return self._shards > 1 and not self.even_batches and not self._drop_last

    def _gets_part(self, real: int) -> bool:
        start, stop, _ = self._my_range(real)
        return start < stop

    def _my_part(self, batch: Any, real: int, first: Any) -> Any:
        """This process's slice of a step holding ``real`` samples (``None``: nothing for it)."""
        start, stop, pad = self._my_range(real)
        if start >= stop:
            return None
        if pad:
            batch = self._pad(
                batch,
                math.ceil(real / self._shards) * self._shards - real,
                first,
            )
        return self._slice(batch, slice(start, stop))

    def _pad(self, batch: Any, missing: int, first: Any) -> Any:
        pool = find_batch_size(first)
        pieces = [batch]
        while missing > 0:
            take = min(missing, pool)
            pieces.append(self._slice(first, slice(0, take)))
            missing -= take
        return concatenate(pieces)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._fetch_started()
        resume = self._take_resume()
        self._open_epoch(resume)
        try:
            # A resumed epoch still reads its first step, to complete the last one the same way.
            keep = 0
            if resume is not None and resume.batches and self.even_batches and not self._drop_last:
                keep = self._base_batches_per_batch()
            rounds, head = None, None
            if self.state.process_index == 0:
                map_style = not isinstance(self.dataset, IterableDataset)
                iterator = self._create_base_iterator(resume, map_style, keep_first=keep)
                if keep:
                    head = self._read_round(iterator)
                skip = self.skip_batches * self._base_batches_per_batch() + self._pending_drop
                for _ in range(skip):
                    if next(iterator, _END) is _END:
                        break
                rounds = self._local_rounds(iterator)
            first = None
            if keep:
                head_rounds = iter([(head, False)]) if rounds is not None else None
                head, head_round = self._next_round(head_rounds)
                if head_round is not None:
                    first = self._slice(self._materialize(head, head_round), slice(0, self._shards))
            local, announced = self._next_round(rounds)
            while announced is not None:
                batch = self._materialize(local, announced)
                if first is None:
                    first = self._slice(batch, slice(0, self._shards))
                # Read the next step before yielding only where this batch may be this process's
                # last without being the epoch's (an uneven final step that gives it nothing):
                # reading further ahead would finish the sampler's iteration (and so advance
                # a seedable sampler's epoch) earlier than the batches handed out require.
                look_ahead = not announced.last and self._uneven_tail()
                local, following = None, None
                if look_ahead:
                    local, following = self._next_round(rounds)
                mine = self._my_part(batch, announced.real, first)
                if announced.last:
                    self.signal_last_batch(announced.real)
                elif (
                    following is not None and following.last and not self._gets_part(following.real)
                ):
                    # This process's last batch: nothing for it in the final step.
                    self.signal_last_batch(following.real)
                if mine is not None:
                    self._batches_yielded += 1
                    self._fetch_finished()
                    yield mine
                    self._fetch_started()
                if not announced.last and not look_ahead:
                    local, following = self._next_round(rounds)
                announced = following
            self._complete_epoch()
        finally:
            self._close_epoch()
