"""Prepared dataloaders yield plain PyTorch's order and leave its generators where PyTorch does.

Over several epochs, for every kind of sampler: the batches (interleaved over the processes)
are the plain DataLoader's in one process, and after each epoch the user's generator and torch's
global generator are in the states plain PyTorch leaves them in, bit for bit.
"""

import pytest
import torch
from data_helpers import interleave
from order_cases import CASES, SIZE, WORKER_CASES, plain_and_prepared
from order_workers import order_job
from torch.utils.data import RandomSampler

from accel_data.random_order import GlobalSeedRandomSampler, random_sampler_indices
from accel_state.testing import spawn_workers

EPOCHS = 3


@pytest.mark.parametrize(
    ("replacement", "num_samples"),
    [(False, None), (False, 40), (False, 25), (False, 7), (True, 64), (True, 70), (True, None)],
)
def test_bulk_indices_leave_the_generator_as_random_sampler_does(replacement, num_samples):
    sampler = RandomSampler(range(20), replacement, num_samples, torch.Generator().manual_seed(1))
    expected = [list(sampler) for _ in range(EPOCHS)]
    expected_state = sampler.generator.get_state()
    sampler.generator.manual_seed(1)
    assert [random_sampler_indices(sampler) for _ in range(EPOCHS)] == expected
    assert torch.equal(sampler.generator.get_state(), expected_state)


@pytest.mark.parametrize(("replacement", "num_samples"), [(False, None), (False, 30), (True, 33)])
def test_global_seed_sampler_alone_is_random_sampler_without_a_generator(replacement, num_samples):
    torch.manual_seed(5)
    expected = [list(RandomSampler(range(20), replacement, num_samples)) for _ in range(EPOCHS)]
    expected_state = torch.get_rng_state()
    torch.manual_seed(5)
    sampler = GlobalSeedRandomSampler(range(20), replacement, num_samples)
    assert [list(sampler) for _ in range(EPOCHS)] == expected
    assert torch.equal(torch.get_rng_state(), expected_state)


def assert_same_states(prepared: dict, plain: dict, keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        assert torch.equal(prepared[key], plain[key]), f"{where}: {key} generator state differs"


@pytest.mark.parametrize("name", list(CASES) + list(WORKER_CASES))
def test_one_process_matches_plain_pytorch(name):
    case = (CASES | WORKER_CASES)[name]
    result = plain_and_prepared(case, seed=11, epochs=EPOCHS, put_on_device=True)
    for epoch, (plain, prepared) in enumerate(
        zip(result["plain"], result["prepared"], strict=True)
    ):
        assert prepared["batches"] == plain["batches"], f"epoch {epoch}"
        assert_same_states(prepared, plain, ("generator", "torch"), f"epoch {epoch}")


def test_one_process_matches_plain_pytorch_with_split_batches():
    result = plain_and_prepared(CASES["shuffle"], seed=3, epochs=EPOCHS, split_batches=True)
    for plain, prepared in zip(result["plain"], result["prepared"], strict=True):
        assert prepared["batches"] == plain["batches"]
        assert_same_states(prepared, plain, ("generator", "torch"), "split")


@pytest.mark.parametrize("name", ["shuffle_generator", "shuffle", "custom_sampler", "sequential"])
def test_one_process_dispatching_matches_plain_pytorch(name):
    result = plain_and_prepared(
        CASES[name], seed=5, epochs=EPOCHS, put_on_device=True, dispatch_batches=True
    )
    for plain, prepared in zip(result["plain"], result["prepared"], strict=True):
        assert prepared["batches"] == plain["batches"]
        assert_same_states(prepared, plain, ("generator", "torch"), name)


def check_job(world_size: int, results: list[dict], cases: list[str], split: bool) -> None:
    """Process 0's plain run is the reference order; every process drew like its own plain run."""
    for name in cases:
        for epoch in range(EPOCHS):
            plain = [result[name]["plain"][epoch] for result in results]
            prepared = [result[name]["prepared"][epoch] for result in results]
            expected = [sample for batch in plain[0]["batches"] for sample in batch]
            stream = interleave([rank["batches"] for rank in prepared])
            where = f"{name}, epoch {epoch}"
            # The last round is completed with the epoch's first samples, after the real ones.
            assert stream[: len(expected)] == expected, where
            assert len(stream) - len(expected) < 4 * (1 if split else world_size), where
            for rank in range(world_size):
                # The sampler's generator is process 0's, synchronised; the global one each
                # process's own, consumed as plain PyTorch consumes it.
                source = 0 if CASES[name].sampler_uses_generator else rank
                assert_same_states(prepared[rank], plain[source], ("generator",), where)
                assert_same_states(prepared[rank], plain[rank], ("torch",), where)


@pytest.mark.parametrize("split", [False, True], ids=["whole_batches", "split_batches"])
def test_two_processes_yield_plain_pytorch_order(split):
    # Each process is seeded differently: only the synchronisation makes them agree.
    cases = list(CASES) if not split else ["shuffle_generator", "shuffle", "sequential"]
    results = spawn_workers(order_job, 2, args=(cases, EPOCHS, split), timeout=240)
    check_job(2, results, cases, split)
    assert SIZE % 4  # the short last batch is part of what is compared
