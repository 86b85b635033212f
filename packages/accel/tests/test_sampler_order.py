"""accelerator.prepare keeps plain PyTorch's sample order, generator states and weights, bit for bit.

For every kind of sampler, over several epochs, on 1 and 2 real processes (each seeded
differently, so only the synchronisation makes them agree): process ``r``'s ``j``-th batch is
batch ``j * n + r`` of the plain DataLoader in one process, the generators are left where plain
PyTorch leaves them after each epoch, and the trained weights equal plain PyTorch's.
"""

import pytest
import torch
from sampler_workers import CASES, EPOCHS, compare_job

from accel_state.testing import spawn_workers


def check_case(name: str, results: list[dict]) -> None:
    world_size = len(results)
    reference = results[0][name]["plain"]
    for epoch in range(EPOCHS):
        expected = reference["epochs"][epoch]["batches"]
        for rank, result in enumerate(results):
            prepared = result[name]["prepared"]["epochs"][epoch]
            where = f"{name}, epoch {epoch}, rank {rank}"
            assert prepared["batches"] == expected[rank::world_size], where
            # The sampler's generator is process 0's; the global one each process's own.
            source = 0 if CASES[name].sampler_uses_generator else rank
            own = results[source][name]["plain"]["epochs"][epoch]
            assert torch.equal(prepared["generator"], own["generator"]), where
            own = result[name]["plain"]["epochs"][epoch]
            assert torch.equal(prepared["torch"], own["torch"]), where
    for rank, result in enumerate(results):
        weights = result[name]["prepared"]["weights"]
        assert all(
            torch.equal(mine, plain)
            for mine, plain in zip(weights, reference["weights"], strict=True)
        ), f"{name}: weights of rank {rank} differ from plain PyTorch's"


@pytest.mark.parametrize("world_size", [1, 2], ids=lambda n: f"{n}proc")
def test_prepared_training_matches_plain_pytorch(world_size):
    results = spawn_workers(compare_job, world_size, args=(list(CASES),), timeout=300)
    for name in CASES:
        check_case(name, results)
