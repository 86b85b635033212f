"""The slow-rank report: per-rank time outside backward, exchanged every N steps, against the median."""

import pytest
import workers

from accel.errors import AccelError
from accel.slow_ranks import SlowRankMonitor
from accel_state import PartialState
from accel_state.testing import spawn_workers


def test_a_rank_slower_than_the_median_is_named_with_its_host_on_the_main_process():
    env = {"ACCEL_SLOW_RANK_INTERVAL": "5", "ACCEL_SLOW_RANK_THRESHOLD": "0.5"}
    results = spawn_workers(
        workers.slow_rank_reports, 3, args=(2, 0.05, 12), env=env, timeout=180, reuse=False
    )
    main, *others = results
    assert others == [[], []]  # only the main process reports
    assert len(main) == 1, main  # said once while the same rank stays slow
    report = main[0]
    assert "accel: slow ranks over backward passes 1-5: rank 2 on " in report
    assert "% above the median" in report and "ACCEL_SLOW_RANK_INTERVAL=0 turns" in report
    assert "rank 0 on" not in report and "rank 1 on" not in report


def test_interval_zero_turns_the_report_off():
    env = {"ACCEL_SLOW_RANK_INTERVAL": "0"}
    results = spawn_workers(
        workers.slow_rank_reports, 2, args=(1, 0.05, 6), env=env, timeout=180, reuse=False
    )
    assert results == [[], []]


def test_a_bad_setting_is_an_error_naming_the_variable_and_value(monkeypatch):
    monkeypatch.setenv("ACCEL_SLOW_RANK_THRESHOLD", "fast")
    with pytest.raises(
        AccelError, match=r"ACCEL_SLOW_RANK_THRESHOLD='fast' must be a non-negative"
    ):
        SlowRankMonitor(PartialState())


def test_one_process_has_nothing_to_compare():
    assert SlowRankMonitor(PartialState()).enabled is False


def test_uneven_inputs_under_join_neither_count_nor_exchange():
    env = {"ACCEL_SLOW_RANK_INTERVAL": "2"}
    results = spawn_workers(
        workers.slow_rank_report_around_uneven_inputs, 2, env=env, timeout=180, reuse=False
    )
    assert results == [4, 4]  # only the passes outside the Join block were counted
