"""The same loop on 1, 2 and 3 real processes equals plain SGD on the mean loss of each step."""

import pytest
import torch
import workers

from accel_state.testing import spawn_workers

N, BATCH, ACCUMULATION, LR = 24, 2, 2, 0.1


def reference_weights(steps_indices: list[list[int]]) -> list[list]:
    """Plain float64 SGD where each step uses the mean loss over exactly the given samples."""
    dataset = workers.IndexedRegression(N)
    x, y = dataset.x.double(), dataset.y.double()
    model = workers.make_model().double()
    weight, bias = model.weight.detach().clone(), model.bias.detach().clone()
    history = []
    for indices in steps_indices:
        xs, ys = x[indices], y[indices]
        residual = xs @ weight.T + bias - ys.unsqueeze(-1)  # (k, 1)
        grad_weight = 2 * (residual * xs).mean(dim=0, keepdim=True)
        grad_bias = 2 * residual.mean(dim=0)
        weight, bias = weight - LR * grad_weight, bias - LR * grad_bias
        history.append([weight.tolist(), bias.tolist()])
    return history


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_accumulated_updates_equal_sgd_on_the_mean_loss(world_size):
    results = spawn_workers(
        workers.train_with_accumulation, world_size, args=(N, BATCH, ACCUMULATION, LR), timeout=180
    )
    assert {r["num_processes"] for r in results} == {world_size}
    expected_type = "NO" if world_size == 1 else "MULTI_CPU"
    assert {r["distributed_type"] for r in results} == {expected_type}
    for result in results:
        assert result["violations"] == []
    # Final weights are bit-identical on every rank.
    assert all(r["final"] == results[0]["final"] for r in results)
    # Each optimizer step consumed batch*accumulation samples per rank, all distinct.
    steps = len(results[0]["steps"])
    assert steps == N // (BATCH * ACCUMULATION * world_size)
    union_per_step = [
        sorted(index for r in results for index in r["steps"][s]["indices"]) for s in range(steps)
    ]
    assert sorted(index for step in union_per_step for index in step) == list(range(N))
    expected = reference_weights(union_per_step)
    for step, (got, want) in enumerate(zip(results[0]["steps"], expected, strict=True)):
        for got_tensor, want_tensor in zip(got["weights"], want, strict=True):
            assert torch.allclose(torch.tensor(got_tensor), torch.tensor(want_tensor), atol=1e-5), (
                step
            )


def test_non_sync_micro_steps_keep_gradients_local():
    results = spawn_workers(workers.local_gradients_on_non_sync_steps, 2, timeout=120)
    unsynced = [r["unsynced"] for r in results]
    assert unsynced[0] == [[[1.0] * 4], [1.0]]
    assert unsynced[1] == [[[2.0] * 4], [1.0]]
    # Accumulated local gradients 2 and 4 are averaged to 3 on the sync step (bias: 2 and 2).
    assert results[0]["synced"] == results[1]["synced"] == [[[3.0] * 4], [2.0]]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("n", [1, 7, 101])
def test_gather_for_metrics_returns_exactly_the_dataset(world_size, n):
    tensors, objects = zip(
        *spawn_workers(_both_gathers, world_size, args=(n,), timeout=180), strict=True
    )
    for result in tensors:
        assert result == list(range(n))
    for result in objects:
        assert result == [f"s{i}" for i in range(n)]


def _both_gathers(n: int) -> tuple[list, list]:
    return (
        workers.gather_for_metrics_run(n, 8, as_objects=False),
        workers.gather_for_metrics_run(n, 8, as_objects=True),
    )
