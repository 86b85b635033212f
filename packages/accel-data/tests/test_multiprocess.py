"""Real 2- and 3-process gloo jobs (spawned processes); scenarios are batched per spawn."""

import math

import pytest
from data_helpers import expected_stream, interleave
from data_workers import (
    RESUME_MODES,
    resume_phase_one,
    resume_phase_two,
    scenario_job,
)

from accel_state.testing import spawn_workers

SHARDING = [
    # sequential: the exact global order, wrap-around included
    {
        "size": 24,
        "batch_size": 2,
        "split": False,
        "even": True,
        "drop_last": False,
        "shuffle": False,
    },
    {
        "size": 25,
        "batch_size": 2,
        "split": False,
        "even": True,
        "drop_last": False,
        "shuffle": False,
    },
    {
        "size": 25,
        "batch_size": 6,
        "split": True,
        "even": True,
        "drop_last": False,
        "shuffle": False,
    },
    # shuffled
    {
        "size": 24,
        "batch_size": 2,
        "split": False,
        "even": True,
        "drop_last": False,
        "shuffle": True,
    },
    {
        "size": 25,
        "batch_size": 2,
        "split": False,
        "even": True,
        "drop_last": False,
        "shuffle": True,
    },
    {
        "size": 25,
        "batch_size": 2,
        "split": False,
        "even": False,
        "drop_last": False,
        "shuffle": True,
    },
    {"size": 25, "batch_size": 2, "split": False, "even": True, "drop_last": True, "shuffle": True},
    {"size": 25, "batch_size": 6, "split": True, "even": True, "drop_last": False, "shuffle": True},
    {
        "size": 25,
        "batch_size": 6,
        "split": True,
        "even": False,
        "drop_last": False,
        "shuffle": True,
    },
    {
        "size": 25,
        "batch_size": 2,
        "split": False,
        "even": True,
        "drop_last": False,
        "shuffle": True,
        "seedable": True,
    },
]


def check_epoch(config, n, per_rank_epoch):
    size, batch_size = config["size"], config["batch_size"]
    split, even, drop_last = config["split"], config["even"], config["drop_last"]
    stream = interleave([epoch["batches"] for epoch in per_rank_epoch])
    expected = expected_stream(size, batch_size, n, split, even, drop_last)
    if config["shuffle"]:
        assert len(stream) == len(expected)
        distinct = len(set(expected))
        assert len(set(stream)) == distinct  # every sample once per epoch ...
        assert stream[distinct:] == stream[: len(stream) - distinct]  # ... plus the wrapped start
        if not drop_last:
            assert set(stream) == set(range(size))
    else:
        assert stream == expected
    total = batch_size if split else batch_size * n
    for epoch in per_rank_epoch:
        assert epoch["len"] == len(epoch["batches"])
        assert epoch["ends"] == [False] * (len(epoch["batches"]) - 1) + [True]
        assert epoch["remainder"] == (-1 if drop_last else size % total)
    return stream


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"{n}proc")
def job(request):
    """One spawned job per world size runs every sharding and dispatching scenario."""
    results = spawn_workers(scenario_job, request.param, args=(SHARDING, DISPATCH), timeout=200)
    return request.param, results


def test_sharding_across_real_processes(job):
    world_size, results = job
    results = [result["sharding"] for result in results]
    for index, config in enumerate(SHARDING):
        runs = [result["configs"][index] for result in results]  # [rank][run][epoch]
        streams = [
            [
                check_epoch(config, world_size, [runs[r][run][e] for r in range(world_size)])
                for e in range(2)
            ]
            for run in range(2)
        ]
        assert streams[0] == streams[1], "same seed, same order"
        if config["shuffle"]:
            assert streams[0][0] != streams[0][1], "each epoch reshuffles"
    assert len({result["torch_draw"] for result in results}) == 1
    assert len({result["generator_draw"] for result in results}) == 1


DISPATCH = [
    {"kind": "map", "size": 24, "batch_size": 2, "split": False, "even": True, "drop_last": False},
    {"kind": "map", "size": 25, "batch_size": 2, "split": False, "even": True, "drop_last": False},
    {"kind": "map", "size": 25, "batch_size": 6, "split": True, "even": True, "drop_last": False},
    {"kind": "map", "size": 25, "batch_size": 2, "split": False, "even": True, "drop_last": True},
    {
        "kind": "sized_stream",
        "size": 25,
        "batch_size": 2,
        "split": False,
        "even": False,
        "drop_last": False,
    },
    {
        "kind": "stream",
        "size": 25,
        "batch_size": 6,
        "split": True,
        "even": True,
        "drop_last": False,
    },
    {
        "kind": "stream",
        "size": 25,
        "batch_size": 2,
        "split": False,
        "even": True,
        "drop_last": True,
    },
]


def expected_dispatch(size, batch_size, n, split, even, drop_last):
    total = batch_size if split else batch_size * n
    if drop_last:
        full = size // batch_size if split else size // batch_size // n
        return list(range(full * (batch_size if split else total))), total
    tail = size % total
    stream = list(range(size))
    if tail and even:
        stream += list(range(math.ceil(tail / n) * n - tail))
    return stream, tail or total


def test_dispatching_across_real_processes(job):
    world_size, results = job
    results = [result["dispatch"] for result in results]
    for index, config in enumerate(DISPATCH):
        per_rank = [result[index] for result in results]
        assert {epoch["type"] for epoch in per_rank} == {"DataLoaderDispatcher"}
        expected, remainder = expected_dispatch(
            config["size"],
            config["batch_size"],
            world_size,
            config["split"],
            config["even"],
            config["drop_last"],
        )
        assert interleave([epoch["batches"] for epoch in per_rank]) == expected
        for epoch in per_rank:
            if config["kind"] != "stream":
                assert epoch["len"] == len(epoch["batches"])
            if epoch["batches"]:
                assert epoch["ends"][-1] and not any(epoch["ends"][:-1])
                assert epoch["remainder"] == remainder


@pytest.mark.parametrize("world_size", [2, 3])
def test_resume_in_a_fresh_job_continues_exactly(world_size):
    modes = list(RESUME_MODES)
    stop = 2
    first = spawn_workers(resume_phase_one, world_size, args=(modes, stop), timeout=150)
    second = spawn_workers(resume_phase_two, world_size, args=(modes, first), timeout=150)
    for mode in modes:
        for rank in range(world_size):
            reference = first[rank][mode]["reference"]
            assert first[rank][mode]["state"]["batches_yielded"] == stop
            assert second[rank][mode] == [reference[0][stop:], reference[1]], (mode, rank)


def test_a_mesh_shards_over_its_data_parallel_ranks_only():
    """4 processes as dp_shard 2 x tp 2 (an accel-state mesh, no accel): the two ranks of a tp
    group get the same batches, and the two data-parallel shards together read the epoch as a
    2-process job does (sharded and dispatched loaders alike)."""
    from data_workers import mesh_job

    sharding = [SHARDING[i] for i in (1, 2, 9)]
    dispatch = [DISPATCH[i] for i in (1, 5)]
    results = spawn_workers(mesh_job, 4, args=(sharding, dispatch), timeout=300)
    assert [result["dp_index"] for result in results] == [0, 0, 1, 1]
    for index, config in enumerate(sharding):
        runs = [result["sharding"]["configs"][index] for result in results]
        assert runs[0] == runs[1] and runs[2] == runs[3], "a tp group shares its batches"
        for run in range(2):
            check_epoch(config, 2, [runs[r][run][e] for r in (0, 2) for e in (0,)])
    for index, config in enumerate(dispatch):
        per_rank = [result["dispatch"][index] for result in results]
        assert per_rank[0]["batches"] == per_rank[1]["batches"]
        assert per_rank[2]["batches"] == per_rank[3]["batches"]
        expected, _ = expected_dispatch(
            config["size"],
            config["batch_size"],
            2,
            config["split"],
            config["even"],
            config["drop_last"],
        )
        assert interleave([per_rank[0]["batches"], per_rank[2]["batches"]]) == expected
