"""A prepared loader tells its fetch observer when each batch is asked for and ready."""

import pickle
import time

import torch
from torch.utils.data import DataLoader, Dataset

from accel_data import prepare_data_loader


class SlowAt(Dataset):
    """8 numbers; reading ``slow`` sleeps ``seconds``."""

    def __init__(self, slow: int, seconds: float) -> None:
        self.slow, self.seconds = slow, seconds

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.slow:
            time.sleep(self.seconds)
        return torch.tensor(index)


class Clock:
    """A fetch observer that keeps each fetch's seconds."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.fetches: list[float] = []

    def fetch_started(self) -> None:
        self.started = time.perf_counter()

    def fetch_finished(self) -> None:
        assert self.started is not None, "finished without a start"
        self.fetches.append(time.perf_counter() - self.started)
        self.started = None


def test_each_batch_is_timed_from_the_request_to_the_hand_over():
    loader = prepare_data_loader(DataLoader(SlowAt(5, 0.2), batch_size=2), put_on_device=False)
    clock = Clock()
    loader.fetch_observer = clock
    batches = [batch.tolist() for batch in loader]
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert len(clock.fetches) == 4
    # The loader reads one batch ahead: sample 5 is read while the second batch is handed over.
    slow = [index for index, seconds in enumerate(clock.fetches) if seconds >= 0.2]
    assert slow == [1], clock.fetches


def test_the_dispatcher_times_its_batches_too():
    loader = prepare_data_loader(
        DataLoader(SlowAt(-1, 0.0), batch_size=2), put_on_device=True, dispatch_batches=True
    )
    clock = Clock()
    loader.fetch_observer = clock
    assert len(list(loader)) == 4 and len(clock.fetches) == 4


def test_a_pickled_loader_leaves_its_observer_behind():
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2), put_on_device=False)
    loader.fetch_observer = Clock()
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.fetch_observer is None and loader.fetch_observer is not None
    assert [batch.tolist() for batch in copy] == [[0, 1], [2, 3]]
