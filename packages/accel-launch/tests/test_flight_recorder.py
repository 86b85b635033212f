"""Reading torch's Flight Recorder dumps into the launcher's per-rank positions (NCCL hangs)."""

import pathlib
import pickle
import subprocess
import sys

import pytest
from launch_helpers import SCRIPTS, clean_env

from accel_launch.runners import flight_recorder
from accel_state.contract import FLIGHT_RECORDER_DUMP_ON_TIMEOUT, FLIGHT_RECORDER_DUMP_PREFIX

DUMPER = SCRIPTS / "flight_recorder_dump.py"


def _line(marker: str) -> int:
    lines = DUMPER.read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if text.endswith(marker))


@pytest.mark.torch_feature("flight_recorder_gloo")
def test_dumps_of_a_real_trace_become_one_line_per_rank(tmp_path):
    env = flight_recorder.flight_recorder_env(str(tmp_path))
    assert env[FLIGHT_RECORDER_DUMP_ON_TIMEOUT] == "1"
    prefix = pathlib.Path(env[FLIGHT_RECORDER_DUMP_PREFIX])
    assert prefix.parent.is_dir()  # torch writes <prefix><rank> there; it does not create it
    dump = pathlib.Path(f"{prefix}0")
    subprocess.run(
        [sys.executable, str(DUMPER), str(dump)], env=clean_env(), check=True, timeout=120
    )
    data = flight_recorder.read_dump(dump)
    assert data is not None
    # Rank 1 still waits in collective 2: its entry is not retired.
    for entry in data["entries"]:
        if entry["collective_seq_id"] == 2:
            entry["retired"] = False
    pathlib.Path(f"{prefix}1").write_bytes(pickle.dumps(data))
    pathlib.Path(f"{prefix}2").write_bytes(pickle.dumps(pathlib.PurePosixPath("x")))  # a class
    found = flight_recorder.positions(str(tmp_path))
    assert found == {
        0: f"last entered gloo:all_reduce #3 (flight_recorder_dump.py:{_line('# collective 3')}, Float [[2, 3]])",
        1: f"waits in gloo:all_gather #2 (flight_recorder_dump.py:{_line('# collective 2')}, Float [[4]])",
    }
