"""Real 2- and 3-process gloo jobs started with spawned processes."""

import time

import pytest
import workers

from accel_state.failures import is_secondary_failure
from accel_state.testing import WorkerFailedError, WorkersTimedOutError, spawn_workers


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_and_type(world_size):
    results = spawn_workers(workers.describe_state, world_size, timeout=120)
    assert [r["index"] for r in results] == list(range(world_size))
    assert {r["type"] for r in results} == {"MULTI_CPU"}
    assert {r["num_processes"] for r in results} == {world_size}
    assert {r["backend"] for r in results} == {"gloo"}
    assert [r["main"] for r in results] == [True] + [False] * (world_size - 1)
    assert [r["last"] for r in results] == [False] * (world_size - 1) + [True]
    assert [r["local_index"] for r in results] == list(range(world_size))
    assert {r["sum"] for r in results} == {world_size * (world_size + 1) / 2}
    assert all(r["group_started_by_us"] for r in results)


def test_main_process_first_ordering(tmp_path):
    seen = spawn_workers(workers.ordering, 3, args=(str(tmp_path),), timeout=120)
    main_first, local_first = zip(*seen, strict=True)
    assert main_first[0] == ""
    assert all("main-done" in entry for entry in main_first[1:])
    # On one machine the local main is rank 0, so the others see its second marker too.
    assert all("local-main-done-0" in entry for entry in local_first[1:])


def test_barrier_waits_for_the_slowest_rank():
    times = spawn_workers(workers.barrier_timing, 2, timeout=120)
    assert abs(times[0] - times[1]) < 0.5


def test_split_between_processes_uneven_and_padded():
    plain = spawn_workers(workers.split_everything, 3, args=(False,), timeout=120)
    assert [r["list"] for r in plain] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [r["tuple"] for r in plain] == [("a", "b"), ("c", "d"), ("e",)]
    assert [r["tensor"] for r in plain] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9]]]
    assert [r["dict"] for r in plain] == [
        {"x": [1, 2], "y": [10, 20]},
        {"x": [3], "y": [30]},
        {"x": [4], "y": [40]},
    ]
    assert [r["tiny"] for r in plain] == [[0], [], []]
    # As in Accelerate, a string is one item: every process gets all of it.
    assert [r["string"] for r in plain] == ["abcde"] * 3
    padded = spawn_workers(workers.split_everything, 3, args=(True,), timeout=120)
    assert [r["list"] for r in padded] == [[0, 1, 2], [3, 4, 4], [5, 6, 6]]
    assert [r["tuple"] for r in padded] == [("a", "b"), ("c", "d"), ("e", "e")]
    assert [r["tensor"] for r in padded] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [8, 9]]]
    assert [r["dict"]["x"] for r in padded] == [[1, 2], [3, 3], [4, 4]]
    assert [r["tiny"] for r in padded] == [[0], [0], [0]]
    assert [r["string"] for r in padded] == ["abcde"] * 3


def test_split_between_processes_gives_a_string_whole_on_two_processes():
    results = spawn_workers(workers.split_everything, 2, args=(False,), timeout=120)
    assert [r["string"] for r in results] == ["abcde", "abcde"]
    assert [r["list"] for r in results] == [[0, 1, 2, 3], [4, 5, 6]]


def test_decorators_run_on_the_right_ranks():
    results = spawn_workers(workers.decorated_calls, 3, timeout=120)
    assert [r["main"] for r in results] == [0, None, None]
    assert [r["local_main"] for r in results] == [0, None, None]
    assert [r["last"] for r in results] == [None, None, 2]
    assert [r["one"] for r in results] == [None, 1, None]
    assert [r["local_one"] for r in results] == [None, 1, None]


def test_print_only_on_local_main(tmp_path):
    prefix = str(tmp_path / "out")
    spawn_workers(workers.printing, 2, args=(prefix,), timeout=120)
    assert (tmp_path / "out.0").read_text() == "hello 0\n"
    assert (tmp_path / "out.1").read_text() == ""


def test_gradient_state_is_process_local():
    assert spawn_workers(workers.gradient_state_is_per_process, 2, timeout=120) == [True, False]


def test_existing_process_group_is_adopted_not_restarted():
    results = spawn_workers(workers.adopt_existing_group, 2, timeout=120)
    assert results == [{"index": 0, "num": 2, "owns": False}, {"index": 1, "num": 2, "owns": False}]


def test_stopping_frees_the_group_even_after_ddp():
    # torch.distributed.nn captures the default group in default arguments when imported after
    # the group starts; a group kept alive that way keeps its gloo threads past interpreter exit.
    assert spawn_workers(workers.group_freed_after_stop, 2, timeout=120) == [True, True]


@pytest.mark.timeout(300)
def test_reset_and_restart_many_times_while_old_groups_live():
    # Regression: the third start hung in the rendezvous when a prepared DDP model still held
    # an earlier group (rank 0's old store kept the port and served the old group's keys).
    assert spawn_workers(workers.restart_while_old_groups_live, 2, args=(4,), timeout=180) == [
        [3.0] * 4,
        [3.0] * 4,
    ]


def test_failure_in_one_rank_ends_the_job_with_its_traceback():
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as raised:
        spawn_workers(workers.fail_on_rank_one, 2, timeout=120)
    assert "Rank 1 of 2 failed" in str(raised.value)
    assert "rank one exploded on purpose" in str(raised.value)
    assert time.monotonic() - started < 60


def test_the_cause_is_named_even_when_a_peers_transport_error_arrives_first():
    with pytest.raises(WorkerFailedError) as raised:
        spawn_workers(workers.cause_reported_after_a_peer_breaks, 2, timeout=120)
    message = str(raised.value)
    assert message.startswith("Rank 1 of 2 failed first:")
    assert "RuntimeError: the real cause, on rank 1" in message
    consequence = message.split("Also failed (after it): rank 0:", 1)[1]
    assert is_secondary_failure(consequence), consequence  # gloo: connection closed or reset


def test_spawned_workers_use_the_cpu_unless_told_otherwise():
    assert spawn_workers(workers.device_and_cpu_flag, 2) == [("cpu", "true")] * 2
    kinds = spawn_workers(workers.device_and_cpu_flag, 2, use_cpu=False)
    assert [flag for _, flag in kinds] == [None, None]


def test_hung_workers_are_killed_at_the_deadline():
    started = time.monotonic()
    with pytest.raises(WorkersTimedOutError, match=r"Ranks \[0, 1\] of 2 did not finish"):
        spawn_workers(workers.hang_forever, 2, timeout=5)
    assert time.monotonic() - started < 30


def test_process_group_timeout_turns_a_hang_into_an_error():
    started = time.monotonic()
    with pytest.raises(WorkerFailedError, match="Rank 0 of 2 failed"):
        spawn_workers(
            workers.barrier_with_a_straggler,
            2,
            timeout=240,
            env={"ACCEL_PROCESS_GROUP_TIMEOUT": "3"},
        )
    # The straggler sleeps 300 s: ending long before that is the 3 s group timeout's doing.
    assert time.monotonic() - started < 150


@pytest.mark.torch_feature("device_mesh")
def test_parallel_mesh_ranks_and_data_parallel_groups():
    results = spawn_workers(workers.mesh_layouts, 4, timeout=300)
    for rank, result in enumerate(results):
        assert result["dp_shard2_tp2"]["names"] == ["dp_shard", "tp"]
        assert result["hsdp2x2"]["names"] == ["dp_replicate", "dp_shard"]
        assert result["tp_auto"]["names"] == ["tp"] and result["tp_auto"]["tp_size"] == 4
        for layout in ("dp_shard2_tp2", "hsdp2x2", "tp_auto"):
            assert all(result[layout]["agree"].values()), (layout, result[layout]["agree"])
            assert "Mesh 'cp' is not available" in result[layout]["cp_error"]
        # Ranks of one tp group share a batch: data-parallel index = dp_shard coordinate.
        assert result["dp_shard2_tp2"]["dp"] == (2, rank // 2)
        assert result["dp_shard2_tp2"]["dp_sum"] == (0 + 2 if rank % 2 == 0 else 1 + 3)
        assert result["hsdp2x2"]["dp"] == (4, rank) and result["hsdp2x2"]["dp_sum"] == 6
        assert result["tp_auto"]["dp"] == (1, 0)
        assert result["plain_dp"] == (4, rank)
