"""Prepared loaders on the XLA device (xla leg: torch_xla 2.9, PJRT_DEVICE=CPU, one device).

Batches reach the device through torch_xla's device loader (``MpDeviceLoaderWrapper``) while the
epoch bookkeeping stays on the iterating thread. Other ranks are simulated with
``num_processes``/``process_index``, as in test_prepare.py; ``xla(min_devices=2)`` needs a TPU VM.
"""

import math
import threading

import pytest
import torch
import xla_workers
from data_helpers import Doubling, Stream, numbers, values
from torch.utils.data import DataLoader, Dataset

from accel_data import (
    DataLoaderDispatcher,
    MpDeviceLoaderWrapper,
    prepare_data_loader,
    set_seed,
    skip_first_batches,
)
from accel_state import GradientState, PartialState
from accel_state.testing import spawn_xla_workers

pytestmark = [pytest.mark.xla, pytest.mark.usefixtures("xla_state")]


def on_device(loader, **options):
    return prepare_data_loader(loader, put_on_device=True, **options)


def host_values(batches) -> list[list[int]]:
    result = []
    for batch in batches:
        assert batch[0].device.type == "xla"
        result.append(values(batch[0].cpu()))
    return result


def test_batches_arrive_on_the_xla_device_through_torch_xla():
    loader = on_device(DataLoader(Doubling(6), batch_size=2))
    assert isinstance(loader, MpDeviceLoaderWrapper) and loader.device.type == "xla"
    assert loader.dataloader is loader and len(loader) == 3
    import torch_xla.debug.metrics as metrics

    cuts = metrics.counter_value("MarkStep") or 0
    batches = list(loader)
    # torch_xla's per-device loader cuts the graph each time a batch is taken.
    assert (metrics.counter_value("MarkStep") or 0) - cuts >= len(batches)
    assert [b["x"].device.type for b in batches] == ["xla"] * 3
    assert batches[1]["x"].cpu().tolist() == [[2, 4], [3, 6]]
    assert batches[2]["pair"][0].device.type == "xla" and batches[2]["pair"][1].tolist() == [4, 5]


@pytest.mark.parametrize("split", [False, True])
def test_each_rank_gets_its_shard_on_the_device(split):
    per_rank = [
        host_values(
            on_device(
                DataLoader(numbers(10), batch_size=4 if split else 2),
                num_processes=2,
                process_index=rank,
                split_batches=split,
            )
        )
        for rank in range(2)
    ]
    assert per_rank == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]


def test_end_of_epoch_is_signalled_when_the_loop_takes_the_last_batch():
    loader = on_device(DataLoader(numbers(7), batch_size=2))
    seen = []
    for _batch in loader:
        state = GradientState()
        seen.append((state.in_dataloader, state.end_of_dataloader, state.remainder))
    # Without the look-ahead on this thread, the background reader would have announced the end
    # while earlier batches were still queued.
    assert seen == [(True, False, 1)] * 3 + [(True, True, 1)]
    assert not GradientState().in_dataloader


def test_shuffle_is_the_same_as_on_the_host_and_follows_the_epoch():
    def epochs(put_on_device):
        set_seed(3)
        loader = prepare_data_loader(
            DataLoader(numbers(8), batch_size=4, shuffle=True), put_on_device=put_on_device
        )
        return [[values(batch[0].cpu()) for batch in loader] for _ in range(2)]

    on_xla, on_host = epochs(True), epochs(False)
    assert on_xla == on_host
    assert on_xla[0] != on_xla[1]


def test_mid_epoch_state_resumes_on_the_device():
    def make():
        set_seed(1)
        return on_device(DataLoader(numbers(10), batch_size=2, shuffle=True))

    loader = make()
    iterator = iter(loader)
    first = [values(next(iterator)[0].cpu()) for _ in range(2)]
    state = loader.state_dict()
    rest = [values(batch[0].cpu()) for batch in iterator]
    resumed = make()
    resumed.load_state_dict(state)
    assert host_values(resumed) == rest and len(first + rest) == 5


def test_skip_first_batches_keeps_the_device_loader():
    loader = on_device(DataLoader(numbers(8), batch_size=2))
    skipped = skip_first_batches(loader, 3)
    assert isinstance(skipped, MpDeviceLoaderWrapper)
    assert host_values(skipped) == [[6, 7]]


class Failing(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        if index == 3:
            raise ValueError("sample 3 is corrupt")
        return torch.tensor(index)


def test_a_dataset_error_reaches_the_loop():
    loader = on_device(DataLoader(Failing(), batch_size=2))
    with pytest.raises(ValueError, match="sample 3 is corrupt"):
        list(loader)
    assert not GradientState().in_dataloader


def test_breaking_out_stops_the_reader_threads():
    loader = on_device(DataLoader(numbers(64), batch_size=2))
    before = threading.active_count()
    for _batch in loader:
        break
    assert threading.active_count() == before
    assert len(list(loader)) == 32  # a new iteration starts from the beginning


def test_iterable_datasets_shard_or_dispatch_on_the_device():
    sharded = on_device(DataLoader(Stream(6), batch_size=2), dispatch_batches=False)
    assert isinstance(sharded, MpDeviceLoaderWrapper)
    assert host_values([[batch] for batch in sharded]) == [[0, 1], [2, 3], [4, 5]]
    dispatched = on_device(DataLoader(Stream(6), batch_size=2))
    assert isinstance(dispatched, DataLoaderDispatcher)
    assert host_values([[batch] for batch in dispatched]) == [[0, 1], [2, 3], [4, 5]]


def test_the_host_is_kept_when_batches_are_not_placed():
    loader = prepare_data_loader(DataLoader(numbers(4), batch_size=2))
    assert not isinstance(loader, MpDeviceLoaderWrapper)
    assert next(iter(loader))[0].device.type == "cpu"
    assert PartialState().device.type == "xla"


def check_shared_epochs(results: list[dict]) -> None:
    """Every replica's batches on the device; together, each epoch covers the dataset once."""
    assert [result["rank"] for result in results] == list(range(len(results)))
    assert {result["type"] for result in results} == {"MpDeviceLoaderWrapper"}
    assert {tuple(result["devices"]) for result in results} == {("xla",)}
    per_round = 4 * len(results)
    for epoch in range(2):
        samples = [sample for result in results for sample in result["epochs"][epoch]]
        assert set(samples) == set(range(40))  # every sample, duplicates only to even the end
        assert len(samples) == math.ceil(40 / per_round) * per_round
    assert results[0]["epochs"][0] != results[0]["epochs"][1]


def test_a_one_replica_job_gets_every_sample():
    check_shared_epochs([xla_workers.sharded_epochs(40, 4)])  # the TPU worker, on this device


@pytest.mark.xla(min_devices=2)
def test_replicas_share_each_shuffled_epoch():
    results = spawn_xla_workers(xla_workers.sharded_epochs, args=(40, 4), timeout=600)
    assert len(results) >= 2
    check_shared_epochs(results)
