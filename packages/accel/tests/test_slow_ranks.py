"""The slow-rank report: each rank's own time per phase of a step, against the median rank's."""

import subprocess
import sys

import pytest
import workers

from accel.errors import AccelError
from accel.slow_ranks import PHASES, SlowRankMonitor
from accel_state import PartialState
from accel_state.testing import spawn_workers

DESCRIPTIONS = {
    "data": "in data loading",
    "forward": "in forward and the script's own code",
    "backward": "in backward",
    "optimizer": "in the optimizer step",
}


def test_a_rank_slower_than_the_median_is_named_with_its_host_on_the_main_process():
    env = {"ACCEL_SLOW_RANK_INTERVAL": "5"}
    results = spawn_workers(
        workers.slow_rank_reports, 3, args=(2, 0.05, 16), env=env, timeout=180, reuse=False
    )
    main, *others = results
    assert others == [[], []]  # only the main process reports
    assert len(main) == 1, main  # said once while the same rank stays slow
    report = main[0]
    # Confirmed in the second window (exchanged at the 5th and 10th backward passes).
    assert "accel: slow ranks over backward passes 1-10: rank 2 on " in report
    assert "ms per step more than the typical rank in forward and the script's own code" in report
    assert "ACCEL_SLOW_RANK_INTERVAL=0 turns" in report
    assert "rank 0 on" not in report and "rank 1 on" not in report


def test_a_rank_slow_in_each_phase_in_turn_is_named_in_that_phase_within_20_steps():
    """4 ranks; rank 1 slower by 200 ms in data, forward, backward, then the optimizer step."""
    steps_per_phase = 30
    results = spawn_workers(
        workers.slow_rank_in_each_phase,
        4,
        args=(1, 0.2, list(PHASES), steps_per_phase),
        timeout=300,
        reuse=False,
    )
    assert all(result["enabled"] for result in results)
    assert [result["reports"] for result in results[1:]] == [[], [], []]
    reports = results[0]["reports"]
    assert len(reports) == len(PHASES), reports
    for index, (phase, (step, report)) in enumerate(zip(PHASES, reports, strict=True)):
        began = index * steps_per_phase
        assert began <= step < began + 20, (phase, step, report)
        assert "rank 1 on " in report and DESCRIPTIONS[phase] in report, (phase, report)
        others = [p for p in PHASES if p != phase]
        assert not any(DESCRIPTIONS[other] + " (" in report for other in others), report
        assert not any(f"rank {rank} on" in report for rank in (0, 2, 3)), report


@pytest.fixture
def busy_machine():
    """A process spinning on a core beside the job for the length of the test."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def test_a_busy_machine_with_no_slow_rank_gives_no_report_over_300_steps(busy_machine):
    results = spawn_workers(
        workers.slow_rank_in_each_phase, 4, args=(1, 0.0, [""], 300), timeout=300, reuse=False
    )
    assert [result["reports"] for result in results] == [[], [], [], []]
    assert results[0]["windows"] == 30  # one every 10 backward passes: every window was judged


def test_interval_zero_turns_the_report_off():
    env = {"ACCEL_SLOW_RANK_INTERVAL": "0"}
    results = spawn_workers(
        workers.slow_rank_reports, 2, args=(1, 0.05, 6), env=env, timeout=180, reuse=False
    )
    assert results == [[], []]


@pytest.mark.parametrize(
    "name, value",
    [("ACCEL_SLOW_RANK_THRESHOLD", "fast"), ("ACCEL_SLOW_RANK_MIN_MS", "-1")],
)
def test_a_bad_setting_is_an_error_naming_the_variable_and_value(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(AccelError, match=rf"{name}='{value}' must be a non-negative"):
        SlowRankMonitor(PartialState())


def test_one_process_has_nothing_to_compare():
    assert SlowRankMonitor(PartialState()).enabled is False


def _judged(windows: list[list[list[float]]]) -> list[str]:
    """The reports a main process makes from these windows of per-rank phase medians."""
    monitor = SlowRankMonitor(PartialState())
    reports = []
    for medians in windows:
        monitor.last_report = ""
        monitor._judge(medians)
        reports.append(monitor.last_report)
    return reports


def test_a_rank_is_named_only_when_slow_in_two_windows_in_a_row():
    normal = [0.001, 0.004, 0.006, 0.002]  # data, forward, backward, optimizer (13 ms)
    slow = [0.001, 0.004, 0.206, 0.002]
    window = [normal, slow, normal, normal]
    reports = _judged([window, [normal] * 4, window, window, window])
    assert reports[:3] == ["", "", ""]  # a single slow window is not enough
    assert "rank 1 on" in reports[3] and "in backward (206.0 ms against 6.0 ms)" in reports[3]
    assert reports[4] == ""  # said once while the same rank stays slow


def test_jitter_below_both_margins_is_not_named():
    normal = [0.001, 0.030, 0.060, 0.010]  # a 101 ms step: the margin is 10.1 ms
    jittery = [0.001, 0.039, 0.060, 0.010]  # 9 ms more: below it
    reports = _judged([[normal, jittery, normal, normal]] * 5)
    assert reports == [""] * 5


def test_uneven_inputs_under_join_neither_count_nor_exchange():
    env = {"ACCEL_SLOW_RANK_INTERVAL": "2"}
    results = spawn_workers(
        workers.slow_rank_report_around_uneven_inputs, 2, env=env, timeout=180, reuse=False
    )
    assert results == [4, 4]  # only the passes outside the Join block were counted
