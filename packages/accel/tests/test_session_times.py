"""scripts/session_times.py: the table of session times that ``nox -t ci`` ends with."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "session_times.py"


@pytest.fixture(scope="module")
def session_times():
    spec = importlib.util.spec_from_file_location("session_times", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites>
  <testsuite name="pytest" errors="1" failures="2" skipped="3" tests="16"/>
  <testsuite name="more" errors="0" failures="0" skipped="1" tests="4"/>
</testsuites>
"""


def test_junit_counts_sum_every_testsuite(session_times, tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    counts = session_times.read_junit_counts(report)
    assert counts == session_times.PytestCounts(passed=13, failed=2, skipped=4, errors=1)
    assert str(counts) == "13/2/4 +1 errors"


def test_a_missing_or_broken_junit_file_gives_no_counts(session_times, tmp_path: Path) -> None:
    broken = tmp_path / "broken.xml"
    broken.write_text("<testsuites><testsuite tests=")
    assert session_times.read_junit_counts(tmp_path / "absent.xml") is None
    assert session_times.read_junit_counts(broken) is None


def test_junit_file_name_is_safe_for_a_parametrized_session(session_times) -> None:
    name = session_times.junit_file_name("tests(package='accel-state', backend='cpu')")
    assert name == "tests-package-accel-state-backend-cpu.xml"


def test_table_aligns_columns_and_totals_sessions_and_tests(session_times) -> None:
    time, counts = session_times.SessionTime, session_times.PytestCounts
    times = [
        time("lint", "success", 12.34, 0.5, cpu_seconds=20.2),
        time(
            "tests(package='accel', backend='cpu')",
            "failed",
            300.0,
            2.0,
            counts(10, 1, 2, 0),
            cpu_seconds=450.6,
        ),
        time("tests(package='accel', backend='cuda')", "skipped", 0.01, 0.2),
        time("integration", "success", 60.25, 1.0, counts(5, 0, 0, 1), cpu_seconds=29.0),
    ]
    rule = "-" * 106
    expected = f"""\
CI session times (wall clock)
{rule}
session                                 result    setup s  session s    cpu s  tests passed/failed/skipped
{rule}
lint                                    success       0.5       12.3       20
tests(package='accel', backend='cpu')   failed        2.0      300.0      451  10/1/2
tests(package='accel', backend='cuda')  skipped       0.2        0.0        0
integration                             success       1.0       60.2       29  5/0/0 +1 errors
{rule}
total (4 sessions)                                    3.7      372.6      500  15/1/2 +1 errors
wall time since the nox run started: 400.0 s
the sessions' CPU time is 1.25 cores busy on average"""
    assert session_times.format_table(times, wall_seconds=400.04) == expected


def test_report_is_written_as_json(session_times, tmp_path: Path) -> None:
    times = [session_times.SessionTime("lint", "success", 1.5, 0.25)]
    path = tmp_path / "nested" / "ci-times.json"
    session_times.write_report(path, times, wall_seconds=2.0)
    data = json.loads(path.read_text())
    assert data["sessions"] == [
        {
            "name": "lint",
            "result": "success",
            "seconds": 1.5,
            "setup_seconds": 0.25,
            "tests": None,
            "started": 0.0,
            "cpu_seconds": 0.0,
        }
    ]
    assert data["total_session_seconds"] == 1.5
    assert data["total_cpu_seconds"] == 0.0
    assert data["wall_seconds"] == 2.0


def test_records_of_this_run_are_read_back_in_starting_order(session_times, tmp_path: Path) -> None:
    # Sessions under `nox --parallel` run in processes of their own: each saves a record file.
    time, counts = session_times.SessionTime, session_times.PytestCounts
    folder = tmp_path / "ci-times"
    older = time("lint", "success", 3.0, 0.1, started=50.0)  # an earlier run's record
    second = time("multihost", "success", 400.0, 2.0, counts(14, 0, 0, 0), started=130.0)
    first = time("tests(package='accel', backend='cpu')", "failed", 30.0, 1.0, started=101.0)
    for entry in (older, second, first):
        session_times.save_record(folder, entry)
    (folder / "broken.json").write_text("{")
    assert session_times.load_records(folder, since=100.0) == [first, second]
    assert session_times.load_records(tmp_path / "absent", since=0.0) == []
    assert second.ended == 530.0


def test_setup_gap_counts_from_the_newest_end_before_the_start(session_times) -> None:
    time = session_times.SessionTime
    earlier = [
        time("a", "success", 10.0, 0.0, started=100.0),
        time("b", "success", 50.0, 0.0, started=105.0),
    ]
    assert session_times.setup_gap(earlier, 112.0, run_started=90.0) == 2.0  # a ended at 110
    assert session_times.setup_gap(earlier, 100.0, run_started=90.0) == 10.0  # nothing ended yet
    assert session_times.setup_gap(earlier, 160.0, run_started=90.0) == 5.0  # b ended at 155
