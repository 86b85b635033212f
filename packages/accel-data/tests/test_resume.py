"""Exact resume in one process: state_dict/load_state_dict and skip_first_batches."""

import pytest
import torch
from data_helpers import SizedStream, Stream, numbers, values
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from accel_data import (
    DataLoaderDispatcher,
    DataLoaderShard,
    ResumeStateError,
    SeedableRandomSampler,
    SkipDataLoader,
    prepare_data_loader,
    set_seed,
    skip_first_batches,
)

BUILDERS = {
    "shuffle": lambda: (DataLoader(numbers(23), batch_size=2, shuffle=True), {}),
    "seedable": lambda: (
        DataLoader(numbers(23), batch_size=2, shuffle=True),
        {"use_seedable_sampler": True},
    ),
    "split": lambda: (DataLoader(numbers(23), batch_size=4, shuffle=True), {"split_batches": True}),
    "uneven": lambda: (
        DataLoader(numbers(23), batch_size=2, shuffle=True),
        {"even_batches": False},
    ),
    "sampler_is_batch_sampler": lambda: (
        DataLoader(
            numbers(23), sampler=BatchSampler(RandomSampler(range(23)), 3, False), batch_size=None
        ),
        {},
    ),
    "iterable": lambda: (DataLoader(SizedStream(23, shuffle=True), batch_size=2), {}),
    "workers": lambda: (DataLoader(numbers(23), batch_size=2, shuffle=True, num_workers=1), {}),
}


def build(mode, seed):
    set_seed(seed)
    loader, options = BUILDERS[mode]()
    return prepare_data_loader(loader, num_processes=2, process_index=1, **options)


def epochs(loader, count):
    return [[values(batch) for batch in loader] for _ in range(count)]


def assert_plain(state):
    for key, value in state.items():
        assert value is None or isinstance(value, (int, torch.Tensor)), key


@pytest.mark.parametrize("mode", list(BUILDERS))
def test_resume_mid_epoch_matches_the_uninterrupted_run(mode):
    reference = epochs(build(mode, seed=3), 2)
    interrupted = build(mode, seed=3)
    stop = 3
    for step, _ in enumerate(interrupted):
        if step + 1 == stop:
            break
    state, rng = interrupted.state_dict(), torch.get_rng_state()
    assert_plain(state)
    assert (state["epoch"], state["batches_yielded"]) == (0, stop)
    resumed = build(mode, seed=99)  # another seed: the state decides the rest of the epoch ...
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # ... and later shuffles follow torch's generator (save_state has it)
    assert resumed.state_dict()["batches_yielded"] == stop
    assert epochs(resumed, 2) == [reference[0][stop:], reference[1]]


@pytest.mark.parametrize("mode", ["shuffle", "seedable", "iterable"])
def test_resume_between_epochs(mode):
    reference = epochs(build(mode, seed=4), 3)
    finished = build(mode, seed=4)
    epochs(finished, 1)
    state, rng = finished.state_dict(), torch.get_rng_state()
    assert (state["epoch"], state["batches_yielded"]) == (1, 0)
    resumed = build(mode, seed=5)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # restored with the state by load_state
    assert epochs(resumed, 2) == reference[1:]


def test_resume_after_the_last_batch_without_leaving_the_loop():
    reference = epochs(build("shuffle", seed=6), 2)
    interrupted = build("shuffle", seed=6)
    for _ in interrupted:
        state, rng = interrupted.state_dict(), torch.get_rng_state()
    assert state["batches_yielded"] == len(reference[0])
    resumed = build("shuffle", seed=7)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)  # restored with the state by load_state
    assert epochs(resumed, 2) == [[], reference[1]]


def test_bad_states_are_refused():
    loader = build("shuffle", seed=0)
    with pytest.raises(ResumeStateError, match="lacks"):
        loader.load_state_dict({"epoch": 0})
    state = loader.state_dict()
    with pytest.raises(ResumeStateError, match="batches_yielded=-1"):
        loader.load_state_dict({**state, "batches_yielded": -1})
    other = prepare_data_loader(
        DataLoader(numbers(23), batch_size=2), num_processes=3, process_index=0
    )
    with pytest.raises(ResumeStateError, match="num_processes=2"):
        other.load_state_dict({**state, "batches_yielded": 2})
    other.load_state_dict({**state, "batches_yielded": 0})  # between epochs any layout works


def test_skip_first_batches_of_a_plain_dataloader():
    loader = DataLoader(numbers(10), batch_size=3)
    skipped = skip_first_batches(loader, 2)
    assert [values(b) for b in skipped] == [[6, 7, 8], [9]]
    assert len(skipped) == 2
    stream = skip_first_batches(DataLoader(Stream(10), batch_size=3), 2)
    assert isinstance(stream, SkipDataLoader)
    assert [values(b) for b in stream] == [[6, 7, 8], [9]]
    as_sampler = DataLoader(numbers(10), sampler=BatchSampler(range(10), 3, False), batch_size=None)
    assert [values(b) for b in skip_first_batches(as_sampler, 3)] == [[9]]


def test_skip_first_batches_of_a_prepared_dataloader():
    reference = epochs(build("shuffle", seed=1), 1)[0]
    loader = build("shuffle", seed=1)  # the global generator back where the reference started
    skipped = skip_first_batches(loader, 2)
    assert isinstance(skipped, DataLoaderShard)
    assert [values(b) for b in skipped] == reference[2:]
    assert len(skipped) == len(reference) - 2
    iterable = prepare_data_loader(
        DataLoader(SizedStream(10), batch_size=2), num_processes=2, process_index=0
    )
    assert [values(b) for b in skip_first_batches(iterable, 1)] == [[4, 5], [8, 9]]
    dispatched = prepare_data_loader(
        DataLoader(numbers(10), batch_size=2), put_on_device=True, dispatch_batches=True
    )
    assert [values(b) for b in skip_first_batches(dispatched, 3)] == [[6, 7], [8, 9]]


@pytest.mark.parametrize("loader_class", [DataLoaderShard, DataLoaderDispatcher])
def test_skip_first_batches_leaves_a_seedable_samplers_epoch_alone(loader_class):
    # Regression: the dispatcher read two steps ahead, so the first batch after skipping to the
    # epoch's last two finished the sampler's iteration and advanced its epoch from 1 to 2.
    sampler = SeedableRandomSampler(numbers(16), data_seed=0)
    loader = loader_class(numbers(16), batch_sampler=BatchSampler(sampler, 4, drop_last=False))
    loader.set_epoch(1)
    skipped = skip_first_batches(loader, 2)
    next(iter(skipped))
    assert sampler.epoch == 1
    assert len(list(skipped)) == 2


def test_resumed_iteration_leaves_the_global_generator_alone():
    # An uninterrupted run drew the iterator's base seed at the epoch start, before the state
    # (RNG included) was saved; resuming must not draw it again, or dropout etc. would diverge.
    set_seed(3)
    loader = prepare_data_loader(DataLoader(numbers(23), batch_size=2, shuffle=True))
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    saved = loader.state_dict()
    resumed = prepare_data_loader(DataLoader(numbers(23), batch_size=2, shuffle=True))
    resumed.load_state_dict(saved)
    before = torch.get_rng_state()
    next(iter(resumed))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("mode", ["shuffle", "workers", "seedable", "iterable"])
def test_resume_between_epochs_draws_what_the_uninterrupted_run_draws(mode):
    # The next epoch starts after the save: its iterator's base seed (and a generator-less
    # RandomSampler's seed) come from the restored global generator, as in the uninterrupted
    # run. Dropout and the like then see the same random numbers.
    uninterrupted = build(mode, seed=8)
    epochs(uninterrupted, 1)
    state, rng = uninterrupted.state_dict(), torch.get_rng_state()
    expected = epochs(uninterrupted, 2)
    expected_rng = torch.get_rng_state()
    resumed = build(mode, seed=9)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    assert epochs(resumed, 2) == expected
    assert torch.equal(torch.get_rng_state(), expected_rng)


@pytest.mark.parametrize("mode", list(BUILDERS))
def test_accelerate_recipe_load_then_skip_first_batches(mode):
    # Accelerate's mid-epoch resume: restore the state, iterate skip_first_batches(loader, k)
    # for the rest of the epoch, then the loader itself for the next epochs.
    reference = epochs(build(mode, seed=12), 2)
    interrupted = build(mode, seed=12)
    stop = 3
    for step, _ in enumerate(interrupted):
        if step + 1 == stop:
            break
    state, rng = interrupted.state_dict(), torch.get_rng_state()
    resumed = build(mode, seed=13)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    skipped = skip_first_batches(resumed, stop)
    assert [values(batch) for batch in skipped] == reference[0][stop:]
    assert epochs(resumed, 1) == [reference[1]]
