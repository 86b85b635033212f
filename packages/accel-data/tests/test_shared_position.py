"""Batches by a position shared across replica groups (accel_data.shared_position).

The quorum here is a plain object answering ``StepQuorum``'s questions with the slots a
test sets; the replica groups themselves (torchft, real processes) are exercised end to end in
tests-integration/ft.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from accel_data import DataConfigurationError, ResumeStateError
from accel_data.shared_position import (
    SharedPosition,
    SharedPositionLoader,
    epoch_order,
    share_bounds,
)


class Slots:
    """A quorum whose step always has the slots the test set (and counts opened steps)."""

    def __init__(self, slot: int = 0, slots: int = 1, training: bool = True) -> None:
        self.slot, self.slots, self.training = slot, slots, training
        self.opened = 0
        self.heal: Callable[[], None] | None = None  # run at the next opened step, once

    def open_step(self) -> tuple[int, int]:
        self.opened += 1
        if self.heal is not None:
            self.heal, heal = None, self.heal
            heal()
        return self.slot, self.slots

    def serves_shared_position(self) -> bool:
        return self.training

    def close_round(self) -> None:
        """Steps of one batch: nothing to end."""


def numbered(count: int) -> TensorDataset:
    return TensorDataset(torch.arange(count))


@pytest.mark.parametrize(("taken", "slots"), [(8, 2), (7, 3), (2, 4), (12, 4)])
def test_shares_partition_the_step(taken: int, slots: int) -> None:
    shares = [share_bounds(10, taken, slot, slots) for slot in range(slots)]
    covered = [index for begin, end in shares for index in range(begin, end)]
    assert covered == list(range(10, 10 + taken))
    sizes = [end - begin for begin, end in shares]
    assert max(sizes) - min(sizes) <= 1


def test_epoch_orders_are_seeded_permutations() -> None:
    assert epoch_order(5, 3, None) == [0, 1, 2, 3, 4]
    first, again = epoch_order(50, 1, 7), epoch_order(50, 1, 7)
    assert first == again and sorted(first) == list(range(50))
    assert epoch_order(50, 2, 7) != first


def test_each_slot_takes_its_share_and_committed_steps_move_on() -> None:
    """Two processes (slots 0 and 1) of one step split 2 x batch samples, in the epoch order."""
    dataset = numbered(12)
    loaders = [
        SharedPositionLoader(DataLoader(dataset, batch_size=3), Slots(slot, 2)) for slot in (0, 1)
    ]
    seen: list[list[int]] = [[], []]
    iterators = [iter(loader) for loader in loaders]
    for _ in range(2):  # 12 samples, 6 per step
        for slot, iterator in enumerate(iterators):
            seen[slot].append(next(iterator)[0].tolist())
        for loader in loaders:
            loader.step_ended(committed=True)
    assert seen == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10, 11]]]
    for iterator in iterators:
        assert next(iterator, None) is None  # the epoch is used up
    assert [loader.position.epoch for loader in loaders] == [1, 1]


def test_an_uncommitted_step_hands_its_samples_out_again() -> None:
    quorum = Slots()
    loader = SharedPositionLoader(DataLoader(numbered(6), batch_size=2), quorum)
    batches = iter(loader)
    assert next(batches)[0].tolist() == [0, 1]
    loader.step_ended(committed=False)
    assert next(batches)[0].tolist() == [0, 1]
    loader.step_ended(committed=True)
    assert next(batches)[0].tolist() == [2, 3]
    assert loader.position.committed == 2 and loader.position.pending == 2


def test_when_a_group_leaves_the_others_take_its_share() -> None:
    quorum = Slots(0, 2)
    loader = SharedPositionLoader(DataLoader(numbered(10), batch_size=2), quorum)
    batches = iter(loader)
    assert next(batches)[0].tolist() == [0, 1]  # slot 1 (another group) took 2, 3
    loader.step_ended(committed=True)
    quorum.slots = 1  # that group died: this one takes the whole step
    assert next(batches)[0].tolist() == [4, 5]
    loader.step_ended(committed=True)
    assert loader.position.committed == 6


def test_the_last_step_of_an_epoch_that_fails_is_retried_before_the_epoch_ends() -> None:
    loader = SharedPositionLoader(DataLoader(numbered(4), batch_size=2), Slots())
    batches = iter(loader)
    next(batches)
    loader.step_ended(committed=True)
    last = next(batches)
    assert last[0].tolist() == [2, 3] and loader.end_of_dataloader
    loader.step_ended(committed=False)
    assert next(batches)[0].tolist() == [2, 3]  # not lost: handed out again
    loader.step_ended(committed=True)
    assert next(batches, None) is None
    assert loader.position.epoch == 1 and loader.position.committed == 0


def test_a_group_healed_ahead_of_its_loop_serves_the_jobs_epoch_then_skips_the_done_ones() -> None:
    """A relaunched group's loop starts at epoch 0; the job (copied in) is in epoch 1."""
    quorum = Slots()
    loader = SharedPositionLoader(DataLoader(numbered(4), batch_size=2), quorum)
    # Healing happens at the first step's quorum, inside the loop's first iteration.
    quorum.heal = lambda: loader.position.load_state_dict(
        {"epoch": 1, "committed": 2, "seed": None}
    )
    assert [batch[0].tolist() for batch in _committing(loader)] == [[2, 3]]
    assert loader.position.epoch == 2
    assert list(_committing(loader)) == []  # its loop's epoch 1 was done by the job already
    assert [batch[0].tolist() for batch in _committing(loader)] == [[0, 1], [2, 3]]


def test_in_eval_mode_the_loader_is_the_in_group_one() -> None:
    evaluation = DataLoader(numbered(4), batch_size=4)
    quorum = Slots(training=False)
    loader = SharedPositionLoader(
        DataLoader(numbered(4), batch_size=2), quorum, in_group=evaluation
    )
    assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 3]]
    assert quorum.opened == 0


def test_state_round_trip_and_resume_at_the_saved_epoch() -> None:
    loader = SharedPositionLoader(
        DataLoader(numbered(8), batch_size=2, shuffle=True), Slots(), seed=3
    )
    batches = iter(loader)
    next(batches)
    loader.step_ended(committed=True)
    state = loader.state_dict()
    assert state == {"shared_position": {"epoch": 0, "committed": 2, "seed": 3}}
    resumed = SharedPositionLoader(DataLoader(numbered(8), batch_size=2, shuffle=True), Slots())
    resumed.load_state_dict(state)
    assert resumed.iteration == 0 and resumed.position.seed == 3
    expected = epoch_order(8, 0, 3)[2:4]
    assert next(iter(resumed))[0].tolist() == expected


def test_bad_inputs_are_named() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield 1

    with pytest.raises(DataConfigurationError, match="map-style dataset"):
        SharedPositionLoader(DataLoader(Stream(), batch_size=2), Slots())
    with pytest.raises(DataConfigurationError, match="batch_size is None"):
        SharedPositionLoader(DataLoader(numbered(4), batch_size=None), Slots())
    loader = SharedPositionLoader(DataLoader(numbered(4), batch_size=2), Slots())
    with pytest.raises(ResumeStateError, match="saved without fault tolerance"):
        loader.load_state_dict({"epoch": 0})
    with pytest.raises(ResumeStateError, match="lacks"):
        SharedPosition().load_state_dict({"epoch": 0})
    eval_only = SharedPositionLoader(DataLoader(numbered(4), batch_size=2), Slots(training=False))
    with pytest.raises(DataConfigurationError, match="in-group loader"):
        list(eval_only)


def _committing(loader: SharedPositionLoader) -> list[list[torch.Tensor]]:
    """One iteration of ``loader`` in which every step commits."""
    batches = []
    for batch in loader:
        batches.append(batch)
        loader.step_ended(committed=True)
    return batches
