"""Long-lived worker pools: reuse, a clean process for every job, and a fresh pool after a failure."""

from __future__ import annotations

import os

import pool_workers
import pytest

from accel_state.testing import WorkerFailedError, spawn_workers
from accel_state.testing.pool import SHARED_POOLS, WorkerPool


@pytest.fixture
def pool():
    """A private 2-process pool, closed after the test."""
    made = WorkerPool(2)
    yield made
    made.close()


def test_jobs_reuse_the_processes_with_a_new_group_each_time(pool, monkeypatch):
    first = pool.run(pool_workers.identity_and_sum, timeout=120)
    monkeypatch.setenv("POOL_TEST_MARKER", "set after the pool started")
    second = pool.run(pool_workers.identity_and_sum, timeout=120)
    assert [r["pid"] for r in first] == [r["pid"] for r in second] == pool.pids
    assert [r["rank"] for r in second] == [0, 1] and {r["sum"] for r in second} == {3.0}
    assert first[0]["port"] != second[0]["port"]  # every job rendezvouses on a new port
    # Each job sees the parent's environment as it is when the job starts.
    assert [r["marker"] for r in first] == [None, None]
    assert [r["marker"] for r in second] == ["set after the pool started"] * 2
    assert pool.jobs_run == 2


def test_a_job_finds_nothing_the_previous_job_changed(pool, tmp_path, capfd):
    pids = pool.run(pool_workers.leave_a_mess, args=(str(tmp_path),), timeout=120)
    after = pool.run(pool_workers.what_the_last_job_left, timeout=120)
    assert [r["pid"] for r in after] == pids
    for rank, report in enumerate(after):
        assert report["group_running"] is False
        assert report["leftover"] is None
        assert report["cwd"] == os.getcwd()
        assert report["sigterm_default"] is True
        assert report["dtype"] == "torch.float32"
        assert report["rank_now"] == rank
    # What each rank printed reaches the test's own output, labelled with the rank.
    out = capfd.readouterr().out
    assert "----- rank 0 output -----\nrank 0 says hello\nrank 0 complains" in out
    assert "----- rank 1 output -----\nrank 1 says hello\nrank 1 complains" in out


def test_a_failed_job_closes_the_pool(pool):
    with pytest.raises(WorkerFailedError, match="rank one failed on purpose"):
        pool.run(pool_workers.fail_on_rank_one, timeout=120)
    assert not pool.alive
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(pool_workers.identity_and_sum, timeout=120)


def test_a_worker_that_dies_is_reported_and_the_pool_closed(pool):
    with pytest.raises(WorkerFailedError, match="Rank 0 of 2 failed first:\nexited with code 3"):
        pool.run(pool_workers.exit_on_rank_zero, timeout=120)
    assert not pool.alive


def test_spawn_workers_replaces_a_broken_shared_pool(monkeypatch):
    monkeypatch.setattr(SHARED_POOLS, "enabled", True)
    monkeypatch.delenv("ACCEL_TEST_FRESH_WORKERS", raising=False)
    before = spawn_workers(pool_workers.identity_and_sum, 2, timeout=120)
    again = spawn_workers(pool_workers.identity_and_sum, 2, timeout=120)
    assert [r["pid"] for r in before] == [r["pid"] for r in again]
    with pytest.raises(WorkerFailedError):
        spawn_workers(pool_workers.fail_on_rank_one, 2, timeout=120)
    fresh = spawn_workers(pool_workers.identity_and_sum, 2, timeout=120)
    assert not {r["pid"] for r in fresh} & {r["pid"] for r in before}
    # reuse=False, or the variable, gives processes of the job's own.
    own = spawn_workers(pool_workers.identity_and_sum, 2, timeout=120, reuse=False)
    assert not {r["pid"] for r in own} & {r["pid"] for r in fresh}
    monkeypatch.setenv("ACCEL_TEST_FRESH_WORKERS", "1")
    also_own = spawn_workers(pool_workers.identity_and_sum, 2, timeout=120)
    assert not {r["pid"] for r in also_own} & {r["pid"] for r in fresh}


def test_a_start_time_variable_gets_a_pool_of_its_own(monkeypatch):
    monkeypatch.setattr(SHARED_POOLS, "enabled", True)
    monkeypatch.delenv("ACCEL_TEST_FRESH_WORKERS", raising=False)
    plain = SHARED_POOLS.pool_for(2, True)
    assert SHARED_POOLS.pool_for(2, True) is plain
    assert SHARED_POOLS.pool_for(2, True, {"OMP_NUM_THREADS": "2"}) is not plain
    assert SHARED_POOLS.pool_for(2, True, {"SOME_RUNTIME_SETTING": "x"}) is plain
