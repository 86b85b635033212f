"""scripts/peer_unit_tests.py: the rename of Accelerate's unit suite and the comparison it judges by.

The suite itself runs in ``nox -s peer``; these check the pure parts on their own: which
``accelerate`` words the rename touches, how junit results become test ids, and when the
comparison fails (an unexpected failure, or an expected-failure entry that went stale).
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys
import textwrap

import pytest


@pytest.fixture
def runner(monkeypatch):
    scripts = pathlib.Path(__file__).resolve().parents[3] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))
    return importlib.import_module("peer_unit_tests")


def test_rename_touches_module_references_only(runner):
    source = textwrap.dedent(
        """\
        import accelerate
        from accelerate.utils import patch_environment
        from accelerate import Accelerator, debug_launcher
        import os, accelerate.state
        x = accelerate.utils.gather
        self.accelerate = Accelerator()
        self.accelerate.save_model(model, "d")
        path_in_accelerate_package("test_utils")
        patch("accelerate.utils.launch.which", return_value=None)
        assertLogs("accelerate.big_modeling", level="WARNING")
        run_import_time("import accelerate, accelerate.utils.transformer_engine")
        run_import_time("from accelerate.commands.launch import launch_command_parser")
        cmd = "pip install accelerate -U"
        folder = Path.home() / ".cache/huggingface/accelerate"
        role = "accelerate_sagemaker_execution_role"
        """
    )
    renamed = runner.rename_module_references(source).splitlines()
    assert renamed[:5] == [
        "import accel",
        "from accel.utils import patch_environment",
        "from accel import Accelerator, debug_launcher",
        "import os, accel.state",
        "x = accel.utils.gather",
    ]
    assert renamed[5:8] == source.splitlines()[5:8]  # an attribute and another identifier
    assert 'patch("accel.utils.launch.which", return_value=None)' in renamed[8]
    assert 'assertLogs("accel.big_modeling"' in renamed[9]
    assert '"import accel, accel.utils.transformer_engine"' in renamed[10]
    assert '"from accel.commands.launch import launch_command_parser"' in renamed[11]
    assert renamed[12:] == source.splitlines()[12:]  # prose, a path and a name stay as they are


def test_junit_classnames_become_file_class_test_ids(runner, tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        """<testsuites><testsuite>
        <testcase classname="tests.test_utils.UtilsTester" name="test_a"/>
        <testcase classname="tests.test_utils" name="test_fn"><skipped/></testcase>
        <testcase classname="tests.test_cli.A" name="test_b"><failure/></testcase>
        <testcase classname="tests.test_cli.A" name="test_c"/>
        <testcase classname="tests.test_cli.A" name="test_c"><error/></testcase>
        </testsuite></testsuites>"""
    )
    assert runner.read_junit(report) == {
        "test_utils.py::UtilsTester::test_a": "passed",
        "test_utils.py::test_fn": "skipped",
        "test_cli.py::A::test_b": "failed",
        "test_cli.py::A::test_c": "failed",  # passed, then failed in teardown
    }


def test_comparison_splits_expected_unexpected_and_stale(runner):
    baseline = {"a": "passed", "b": "passed", "c": "passed", "d": "failed", "e": "skipped"}
    accel = {"a": "passed", "b": "failed", "d": "passed"}
    result = runner.compare(baseline, accel, {"b": "a reason", "a": "stale reason"})
    assert result.baseline_passing == ["a", "b", "c"]
    assert result.passing_on_accel == ["a"]
    assert result.expected_failures == {"b": "a reason"}
    assert result.unexpected == ["c"]  # absent on accel counts as a failure
    assert result.stale_expectations == ["a"]
    assert result.share == pytest.approx(1 / 3)


def test_expectations_need_a_reason(runner):
    assert runner.parse_expectations(["x.py::T::t = why"]) == {"x.py::T::t": "why"}
    with pytest.raises(SystemExit, match="TEST_ID=REASON"):
        runner.parse_expectations(["x.py::T::t"])
    with pytest.raises(SystemExit, match="TEST_ID=REASON"):
        runner.parse_expectations(["x.py::T::t= "])


def test_an_unexpected_failure_runs_again_alone_and_only_a_pass_there_is_called_flaky(
    runner, tmp_path
):
    """A test that measured the machine while another session ran beside it passes alone."""
    tests = tmp_path / "tests"
    tests.mkdir()
    marker = tmp_path / "ran-once"
    (tests / "test_machine.py").write_text(
        textwrap.dedent(
            f"""\
            import pathlib

            def test_flaky():
                marker = pathlib.Path({str(marker)!r})
                first = not marker.exists()
                marker.touch()
                assert not first, "fails the first time only"

            def test_broken():
                assert False, "fails every time"
            """
        )
    )
    flaky_id, broken_id = "test_machine.py::test_flaky", "test_machine.py::test_broken"
    first = runner.run_suite(runner.sys.executable, tmp_path, [], "first", [])
    assert first == {flaky_id: runner.FAILED, broken_id: runner.FAILED}
    outcomes, flaky = runner.rerun_alone(tmp_path, first, [flaky_id, broken_id], [])
    assert flaky == [flaky_id]
    assert outcomes == {flaky_id: runner.PASSED, broken_id: runner.FAILED}


def test_a_record_replays_where_the_versions_it_names_are_installed(runner, tmp_path):
    """--record writes the baseline's outcomes with its versions; the replay checks them."""
    record = tmp_path / "pinned.json"
    outcomes = {"test_a.py::T::test_x": runner.PASSED, "test_a.py::T::test_y": runner.SKIPPED}
    runner.write_outcomes(record, outcomes, sys.executable)
    assert runner.recorded_outcomes(record, "nox -s peer_reference") == outcomes


def test_a_record_from_other_versions_is_refused_naming_the_session(runner, tmp_path):
    record = tmp_path / "pinned.json"
    runner.write_outcomes(record, {"test_a.py::T::test_x": runner.PASSED}, sys.executable)
    data = json.loads(record.read_text())
    data["environment"]["libraries"]["torch"] = "0.0.1"
    record.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match=r"(?s)torch: recorded 0\.0\.1.*nox -s peer_reference"):
        runner.recorded_outcomes(record, "nox -s peer_reference")
    with pytest.raises(SystemExit, match=r"no recorded Accelerate outcomes.*nox -s peer_reference"):
        runner.recorded_outcomes(tmp_path / "absent.json", "nox -s peer_reference")


def test_a_record_is_made_from_the_whole_suite_only(runner, tmp_path):
    with pytest.raises(SystemExit):
        runner.main(["--record", str(tmp_path / "r.json"), "--baseline-python", sys.executable,
                     "--only", "test_utils.py"])  # fmt: skip
    with pytest.raises(SystemExit):
        runner.main(["--record", str(tmp_path / "r.json")])
