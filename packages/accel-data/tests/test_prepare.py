"""prepare_data_loader in one process; other ranks are simulated with num_processes/process_index."""

import itertools

import pytest
import torch
from data_helpers import (
    Doubling,
    SizedStream,
    Stream,
    VariableBatches,
    expected_stream,
    interleave,
    numbers,
    values,
)
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from accel_data import (
    BatchSizeError,
    DataConfigurationError,
    DataLoaderConfiguration,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    RNGSyncError,
    SeedableRandomSampler,
    get_sampler,
    prepare_data_loader,
    set_seed,
)
from accel_state import GradientState


def prepared_ranks(make_loader, n, **options):
    return [
        prepare_data_loader(make_loader(), num_processes=n, process_index=rank, **options)
        for rank in range(n)
    ]


@pytest.mark.parametrize(
    ("n", "size", "split", "even", "drop_last"),
    list(itertools.product([2, 3], [12, 13], [False, True], [True, False], [False, True])),
)
def test_map_style_sharding_and_length(n, size, split, even, drop_last):
    batch_size = 6 if split else 2
    loaders = prepared_ranks(
        lambda: DataLoader(numbers(size), batch_size=batch_size, drop_last=drop_last),
        n,
        split_batches=split,
        even_batches=even,
    )
    per_rank = [[values(batch) for batch in loader] for loader in loaders]
    assert interleave(per_rank) == expected_stream(size, batch_size, n, split, even, drop_last)
    assert [len(loader) for loader in loaders] == [len(batches) for batches in per_rank]


@pytest.mark.parametrize(
    ("n", "size", "split", "drop_last"),
    list(itertools.product([2, 3], [12, 13], [False, True], [False, True])),
)
def test_iterable_sharding_and_length(n, size, split, drop_last):
    batch_size = 6 if split else 2
    loaders = prepared_ranks(
        lambda: DataLoader(SizedStream(size), batch_size=batch_size, drop_last=drop_last),
        n,
        split_batches=split,
    )
    assert all(isinstance(loader.dataset.dataset, SizedStream) for loader in loaders)
    per_rank = [[values(batch) for batch in loader] for loader in loaders]
    total = batch_size if split else batch_size * n
    if drop_last:
        expected = list(range(size // total * total))
    else:
        expected = expected_stream(size, batch_size, n, split, True, False)
    assert interleave(per_rank) == expected
    assert [len(loader) for loader in loaders] == [len(batches) for batches in per_rank]


def test_batch_sampler_passed_as_sampler():
    def make():
        sampler = BatchSampler(SequentialSampler(range(10)), 2, False)
        return DataLoader(numbers(10), sampler=sampler, batch_size=None)

    loaders = prepared_ranks(make, 2)
    per_rank = [[values(batch) for batch in loader] for loader in loaders]
    assert interleave(per_rank) == [i % 10 for i in range(12)]


def test_variable_batch_sampler():
    loaders = prepared_ranks(
        lambda: DataLoader(numbers(11), batch_sampler=VariableBatches([3, 1, 2, 4, 1])), 2
    )
    per_rank = [[values(batch) for batch in loader] for loader in loaders]
    assert per_rank == [[[0, 1, 2], [4, 5], [10]], [[3], [6, 7, 8, 9], [0, 1, 2]]]


def test_end_of_dataloader_and_remainder_in_gradient_state():
    loader = prepare_data_loader(
        DataLoader(numbers(10), batch_size=2), num_processes=3, process_index=2
    )
    state = GradientState()
    seen = []
    for _ in loader:
        seen.append((state.end_of_dataloader, state.remainder, state.in_dataloader))
    assert seen == [(False, 4, True), (True, 4, True)]
    assert not state.in_dataloader and not state.end_of_dataloader
    dropped = prepare_data_loader(
        DataLoader(numbers(10), batch_size=2, drop_last=True), num_processes=3, process_index=0
    )
    assert [state.remainder for _ in dropped] == [-1]


def test_nested_loaders_keep_the_outer_flags():
    outer = prepare_data_loader(
        DataLoader(numbers(4), batch_size=2), num_processes=1, process_index=0
    )
    inner = prepare_data_loader(
        DataLoader(numbers(3), batch_size=2), num_processes=1, process_index=0
    )
    state = GradientState()
    flags = []
    for _ in outer:
        for _ in inner:
            pass
        flags.append(state.end_of_dataloader)
    assert flags == [False, True]


def test_device_placement_keeps_nested_structures():
    loader = prepare_data_loader(DataLoader(Doubling(5), batch_size=2), put_on_device=True)
    assert loader.device == torch.device("cpu")
    batch = next(iter(loader))
    assert batch["x"].tolist() == [[0, 0], [1, 2]]
    assert batch["pair"][0].tolist() == [0, 1]
    assert batch["pair"][1].tolist() == [0, 1]
    assert prepare_data_loader(DataLoader(Doubling(5)), put_on_device=False).device is None
    explicit = prepare_data_loader(
        DataLoader(Doubling(5)), device="cpu", put_on_device=True, non_blocking=True
    )
    assert explicit._non_blocking and explicit.device == torch.device("cpu")


def shuffled_epochs(n, seed, epochs=2, **options):
    # Simulated ranks live in one process: each starts from the same seed, as processes of a
    # job do after set_seed (the real cross-process synchronisation is tested with workers),
    # and draws from its own copy of torch's global generator, as a process does.
    loaders, rng_states = [], []
    for rank in range(n):
        set_seed(seed)
        loader = DataLoader(numbers(24), batch_size=3, shuffle=True)
        loaders.append(prepare_data_loader(loader, num_processes=n, process_index=rank, **options))
        rng_states.append(torch.get_rng_state())
    result = []
    for _ in range(epochs):
        per_rank = []
        for rank, loader in enumerate(loaders):
            torch.set_rng_state(rng_states[rank])
            per_rank.append([values(batch) for batch in loader])
            rng_states[rank] = torch.get_rng_state()
        result.append(per_rank)
    return result


def test_shuffling_agrees_across_ranks_changes_per_epoch_and_repeats_with_the_seed():
    first = shuffled_epochs(2, seed=11)
    for per_rank in first:
        assert sorted(interleave(per_rank)) == list(range(24))
    assert interleave(first[0]) != interleave(first[1])
    assert first == shuffled_epochs(2, seed=11)
    assert first != shuffled_epochs(2, seed=12)


def test_seedable_sampler_and_set_epoch():
    first = shuffled_epochs(3, seed=0, epochs=2, use_seedable_sampler=True, data_seed=5)
    again = shuffled_epochs(3, seed=1, epochs=2, use_seedable_sampler=True, data_seed=5)
    assert first == again  # only data_seed matters
    for per_rank in first:
        stream = interleave(per_rank)  # 24 samples in rounds of 9: 3 wrap around
        assert len(stream) == 27 and set(stream) == set(range(24))
        assert stream[24:] == stream[:3]
    loader = prepare_data_loader(
        DataLoader(numbers(24), batch_size=3, shuffle=True), use_seedable_sampler=True, data_seed=5
    )
    assert isinstance(get_sampler(loader), SeedableRandomSampler)
    loader.set_epoch(1)
    epoch1 = [values(b) for b in loader]
    loader.set_epoch(1)
    assert [values(b) for b in loader] == epoch1
    loader.set_epoch(2)
    assert [values(b) for b in loader] != epoch1


def test_the_original_dataloader_is_left_alone():
    original = DataLoader(numbers(8), batch_size=2, shuffle=True)
    prepared = prepare_data_loader(original, num_processes=2, process_index=0)
    assert original.sampler.generator is None
    assert isinstance(original.sampler, RandomSampler)
    assert prepared.synchronized_generator is not None
    assert prepared.rng_types == ["generator"]
    unsynced = prepare_data_loader(original, rng_types=[])
    assert unsynced.rng_types == []


def stack_first(samples):
    return torch.stack([sample[0] for sample in samples])


def test_workers_and_loader_settings_are_kept():
    original = DataLoader(numbers(12), batch_size=2, num_workers=2, collate_fn=stack_first)
    loaders = prepared_ranks(lambda: original, 2)
    assert loaders[0].num_workers == 2 and loaders[0].collate_fn is stack_first
    assert interleave([[values(b) for b in loader] for loader in loaders]) == list(range(12))


def test_dispatcher_in_one_process():
    loader = prepare_data_loader(DataLoader(Stream(7), batch_size=2), put_on_device=True)
    assert isinstance(loader, DataLoaderDispatcher)
    state = GradientState()
    seen = [(values(batch), state.end_of_dataloader) for batch in loader]
    assert seen == [([0, 1], False), ([2, 3], False), ([4, 5], False), ([6], True)]
    assert state.remainder == 1
    mapped = prepare_data_loader(
        DataLoader(numbers(7), batch_size=2, drop_last=True),
        put_on_device=True,
        dispatch_batches=True,
    )
    assert [values(b) for b in mapped] == [[0, 1], [2, 3], [4, 5]]
    assert len(mapped) == 3


def test_configuration_dataclass_feeds_prepare():
    config = DataLoaderConfiguration(split_batches=True, even_batches=False)
    assert config.to_kwargs() == {
        "split_batches": True,
        "dispatch_batches": None,
        "even_batches": False,
        "use_seedable_sampler": False,
        "data_seed": None,
        "non_blocking": False,
        "use_stateful_dataloader": False,
    }
    loader = prepare_data_loader(
        DataLoader(numbers(10), batch_size=4),
        num_processes=2,
        process_index=1,
        **config.to_kwargs(),
    )
    assert isinstance(loader, DataLoaderShard)
    assert [values(b) for b in loader] == [[2, 3], [6, 7]]


def test_clear_errors():
    with pytest.raises(DataConfigurationError, match="put_on_device=True"):
        prepare_data_loader(DataLoader(numbers(4)), dispatch_batches=True)
    with pytest.raises(BatchSizeError, match=r"batch_size=3 .*num_processes=2"):
        prepare_data_loader(
            DataLoader(numbers(4), batch_size=3),
            num_processes=2,
            process_index=0,
            split_batches=True,
        )
    with pytest.raises(DataConfigurationError, match=r"needs a torch.utils.data.DataLoader"):
        prepare_data_loader([1, 2, 3])
    with pytest.raises(DataConfigurationError, match="real process group"):
        prepare_data_loader(
            DataLoader(numbers(4)),
            num_processes=2,
            process_index=1,
            put_on_device=True,
            dispatch_batches=True,
        )
    with pytest.raises(RNGSyncError, match="rng_type='dice'"):
        prepare_data_loader(DataLoader(numbers(4)), rng_types=["dice"])


def test_total_sizes():
    sub = DataLoader(numbers(11), sampler=RandomSampler(range(11), num_samples=5), batch_size=2)
    loader = prepare_data_loader(sub, num_processes=2, process_index=0)
    assert (loader.total_dataset_length, loader.total_batch_size) == (5, 4)
    split = prepare_data_loader(
        DataLoader(numbers(11), batch_size=4), num_processes=2, process_index=0, split_batches=True
    )
    assert (split.total_dataset_length, split.total_batch_size) == (11, 4)
    variable = prepare_data_loader(
        DataLoader(numbers(11), batch_sampler=VariableBatches([5, 6])),
        num_processes=2,
        process_index=0,
    )
    assert (variable.total_dataset_length, variable.total_batch_size) == (11, None)
    stream = prepare_data_loader(
        DataLoader(SizedStream(9), batch_size=2), num_processes=3, process_index=0
    )
    assert (stream.total_dataset_length, stream.total_batch_size) == (9, 6)


@pytest.mark.cuda
def test_batches_land_on_the_gpu():
    loader = prepare_data_loader(
        DataLoader(Doubling(6), batch_size=2, pin_memory=True),
        device="cuda",
        put_on_device=True,
        non_blocking=True,
    )
    batch = next(iter(loader))
    assert batch["x"].device.type == "cuda" and batch["pair"][0].device.type == "cuda"
    assert batch["x"].cpu().tolist() == [[0, 0], [1, 2]]


def test_dispatched_batches_may_hold_values_that_are_not_tensors():
    # Regression: an iterable dataset (dispatched by default) whose batches held a string
    # raised DispatchError; Accelerate gives every process such values as they are.
    def collate(samples):
        return {"tensor": torch.stack(samples), "name": "shared", "size": len(samples)}

    loader = prepare_data_loader(
        DataLoader(Stream(10), batch_size=4, collate_fn=collate),
        dispatch_batches=True,
        put_on_device=True,
    )
    assert isinstance(loader, DataLoaderDispatcher)
    batches = list(loader)
    assert [values(batch["tensor"]) for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert {batch["name"] for batch in batches} == {"shared"}
    assert [batch["size"] for batch in batches] == [4, 4, 2]


def test_use_stateful_dataloader_makes_torchdata_stateful_dataloaders():
    # Accelerate's loaders made with use_stateful_dataloader=True are StatefulDataLoaders.
    stateful = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    for kind in (DataLoaderShard, DataLoaderDispatcher):
        loader = kind(list(range(8)), batch_size=4, use_stateful_dataloader=True)
        assert isinstance(loader, (kind, stateful)) and isinstance(loader, stateful)
        assert loader.base_dataloader is loader
        assert [values(batch) for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert set(loader.state_dict()) >= {"epoch", "batches_yielded"}  # accel's own state
    plain = DataLoaderShard(list(range(8)), batch_size=4)
    assert not isinstance(plain, stateful) and plain.base_dataloader is plain
    with pytest.raises(AttributeError):
        _ = DataLoaderShard.base_dataloader


def test_a_datasets_iterable_dataset_with_enough_shards_is_sharded_natively():
    datasets = pytest.importorskip("datasets")
    stream = datasets.Dataset.from_dict({"x": list(range(8))}).to_iterable_dataset(num_shards=2)
    loader = prepare_data_loader(
        DataLoader(stream, batch_size=2), num_processes=2, process_index=1, dispatch_batches=False
    )
    assert not isinstance(loader.dataset, IterableDatasetShard)
    assert [values(batch["x"]) for batch in loader] == [[4, 5], [6, 7]]
