"""The wrapper that runs each elastic worker's script and records when and why it failed."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import accel_launch._failure_recorder as recorder

RECORDER = Path(recorder.__file__)


def run_script(tmp_path: Path, body: str, *args: str, error_file: bool = True):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    error_path = tmp_path / "error.json"
    env = {"PATH": "/usr/bin:/bin"}
    if error_file:
        env[recorder.ERROR_FILE] = str(error_path)
    result = subprocess.run(
        [sys.executable, "-u", str(RECORDER), str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    data = json.loads(error_path.read_text()) if error_path.exists() else None
    return result, data


def test_script_runs_as_python_would_run_it(tmp_path):
    result, data = run_script(
        tmp_path,
        """
        import sys, pickle
        class Point:
            pass
        pickle.dumps(Point())
        print(__name__, sys.argv[1:], sys.path[0] == __file__.rsplit("/", 1)[0], __spec__)
        """,
        "--lr",
        "3",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "__main__ ['--lr', '3'] True None"
    assert data is None


def test_exception_is_recorded_with_exact_time_and_the_scripts_own_traceback(tmp_path):
    result, data = run_script(tmp_path, 'raise ValueError("bad lr")\n')
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):\n  File ")
    assert "_failure_recorder" not in result.stderr and "runpy" not in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: bad lr")
    message = data["message"]
    assert message["message"] == "ValueError: bad lr"
    extra = message["extraInfo"]
    assert float(extra[recorder.TIMESTAMP_KEY]) == pytest.approx(int(extra["timestamp"]), abs=1)
    assert "job.py" in extra["py_callstack"] and "_failure_recorder" not in extra["py_callstack"]


def test_non_zero_exit_is_recorded_and_its_code_kept(tmp_path):
    result, data = run_script(tmp_path, "import sys\nsys.exit(3)\n")
    assert result.returncode == 3
    assert data["message"]["message"] == "SystemExit: 3"
    (tmp_path / "error.json").unlink()
    clean, clean_data = run_script(tmp_path, "import sys\nsys.exit(0)\n")
    assert clean.returncode == 0 and clean_data is None


def test_an_error_file_the_script_wrote_itself_is_kept(tmp_path):
    result, data = run_script(
        tmp_path,
        """
        import json, os
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as handle:
            json.dump({"message": "written by @record"}, handle)
        raise RuntimeError("after recording")
        """,
    )
    assert result.returncode == 1 and data == {"message": "written by @record"}


def test_module_mode_runs_the_module_as_main(tmp_path):
    (tmp_path / "tool.py").write_text("import sys\nprint(__name__, sys.argv)\n")
    result = subprocess.run(
        [sys.executable, "-u", str(RECORDER), "-m", "tool", "x"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("__main__ [")
    assert result.stdout.strip().endswith("'x']")


def test_the_recorder_writes_the_contracts_collectives_key():
    from accel_launch import _failure_recorder
    from accel_state.contract import COLLECTIVES_KEY

    assert _failure_recorder.COLLECTIVES_KEY == COLLECTIVES_KEY  # the recorder cannot import it
