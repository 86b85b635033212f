"""Every collective on 2 and 3 real gloo processes (spawned, no mocks)."""

import pytest
from _accel_ops_workers import collectives_worker, debug_worker, objects_by_rank_worker

import accel_ops
from accel_state.testing import spawn_workers


@pytest.mark.parametrize(
    ("world_size", "how"),
    [(2, "direct"), (3, "partial_state")],
    ids=["2-direct", "3-partial-state"],
)
def test_collectives_on_real_processes(world_size, how):
    results = spawn_workers(collectives_worker, world_size, args=(how,), timeout=120)
    assert [result["rank"] for result in results] == list(range(world_size))
    counts = {result["collectives"] for result in results}
    # 3 leaves gathered + 1 reduce + 1 broadcast: one collective each, nothing more.
    assert counts in ({5}, {None})


@pytest.mark.parametrize("world_size", [2, 3])
def test_debug_mode_reports_mismatches_on_every_rank(world_size):
    results = spawn_workers(debug_worker, world_size, timeout=120, env={"ACCEL_DEBUG_MODE": "1"})
    first = results[0]["messages"]
    for result in results:
        assert result["messages"] == first  # every rank raises the same readable error
        assert result["max_seconds"] < 60  # a hang would wait for the 30-minute group timeout
    assert "accel_ops.reduce" in first["reduce"] and "float64[2]" in first["reduce"]
    assert "data['a']" in first["broadcast"] and "data['b']" in first["broadcast"]
    assert "float32[2, 2]" in first["pad"] and "same number of dimensions" in first["pad"]
    assert "process 0: data[0]: str" in first["type"]
    assert "process 1: data['k7']: float32[3]" in first["many"]
    assert "data['k3']" not in first["many"]
    assert "First difference at data['k7']" in first["many"]
    assert "matching leaves not shown" in first["many"]
    if results[0]["without_debug"] is not None:
        assert results[0]["without_debug"] == 2
        assert results[0]["with_debug"] > 2


@pytest.mark.cuda(min_gpus=2)
def test_nccl_collectives_on_two_gpus():
    from _accel_ops_workers import nccl_worker

    assert spawn_workers(nccl_worker, 2, timeout=120) == [0, 1]


@pytest.mark.parametrize("world_size", [2, 3])
def test_objects_by_rank_on_the_default_and_an_explicit_group(world_size):
    """Also gather / gather_object over a sub-group (process_group=...)."""
    # (That this needs no numpy is shown by `nox -s install`, whose venvs have none.)
    results = spawn_workers(objects_by_rank_worker, world_size, timeout=120)
    expected_default = [{"rank": r, "tail": "x" * r} for r in range(world_size)]
    expected_explicit = [[r] * (r + 1) for r in range(world_size)]
    for rank, (default, explicit, grouped) in enumerate(results):
        assert (default, explicit) == (expected_default, expected_explicit)
        same_parity = list(range(rank % 2, world_size, 2))
        assert grouped == (same_parity, [f"r{r}" for r in same_parity])


def test_objects_by_rank_without_a_group_is_the_object_alone():
    assert accel_ops.gather_objects_by_rank("only me") == ["only me"]


@pytest.mark.parametrize("world_size", [1, 2])
def test_accelerate_keyword_names_on_real_processes(world_size):
    from _accel_ops_workers import keyword_worker

    results = spawn_workers(keyword_worker, world_size, timeout=120)
    every_rank = [float(rank) for rank in range(world_size)]
    longest = world_size
    for rank, out in enumerate(results):
        assert out["gather"] == every_rank
        assert out["reduce"] == [sum(r + 1.0 for r in range(world_size))]
        assert out["broadcast"] == [10.0]
        assert out["pad"] == [float(i) for i in range(rank + 1)] + [-1.0] * (longest - rank - 1)
        assert out["send"] == [float(rank)]
        assert out["objects"] == [f"r{r}" for r in range(world_size)]
        assert out["fp32"] == "torch.float32"
        assert out["copied"] == [7.0]
