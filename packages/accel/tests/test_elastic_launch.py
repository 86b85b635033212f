"""``accel launch --num_machines 2:3``: a 3-machine job that loses one for good finishes on 2.

Three launchers on 127.0.0.1 (one worker each, one c10d rendezvous, ``--max_restarts 1``) run
elastic_launch_script.py. Once a checkpoint exists and every worker waits after the step past it,
the launcher of rank 2 is killed with SIGKILL, worker included (rank 2 never hosts the store: the
first launcher does, via ``is_host``, and it is rank 0 or 1 otherwise). The two others restart
(restart 1, WORLD_SIZE 2), resume from the newest checkpoint and finish epoch 0 and epoch 1 with
exactly the samples the uninterrupted order has left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from elastic_launch_script import BATCH, FIRST_WORLD, PAUSE_AT, SAMPLES, SAVE_EVERY

from accel_state.testing.environ import without_launcher_variables

SCRIPT = Path(__file__).with_name("elastic_launch_script.py")
NAMES = ("a", "b", "c")  # "a" starts first and hosts the rendezvous store
# Short rendezvous timings, generous store timeouts: a loaded 2-core machine stalls for seconds.
RDZV = "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5,read_timeout=300"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _launch(name: str, port: int, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = without_launcher_variables(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    host = "1" if name == NAMES[0] else "0"
    command = [sys.executable, "-m", "accel_launch.cli", "launch", "--cpu"]
    command += ["--num_machines", "2:3", "--num_processes", "3", "--max_restarts", "1"]
    command += ["--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
    command += ["--rdzv_conf", f"{RDZV},is_host={host}", "--monitor_interval", "0.5"]
    command += ["--env", f"LAUNCHER={name}", str(SCRIPT)]
    command += ["--project", str(tmp_path / "project"), "--logs", str(tmp_path / "logs")]
    with (tmp_path / f"{name}.out").open("wb") as output:
        return subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted((tmp_path / "logs").glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records


def _wait_for(tmp_path: Path, what: str, count: int, jobs: dict[str, Any]) -> list[dict[str, Any]]:
    """Poll the logs until ``count`` records of event ``what`` exist (no fixed sleeps)."""
    while True:
        found = [r for r in _records(tmp_path) if r["event"] == what and r.get("restart", 0) == 0]
        if len(found) >= count:
            return found
        for name, job in jobs.items():
            if job.poll() is not None:
                output = (tmp_path / f"{name}.out").read_text(errors="replace")
                raise AssertionError(f"launcher {name} exited {job.returncode}:\n{output[-6000:]}")
        time.sleep(0.2)


@pytest.mark.timeout(900)  # hang guard only
def test_a_three_machine_job_losing_rank_2_for_good_finishes_on_two(tmp_path):
    (tmp_path / "logs").mkdir()
    port = _free_port()
    jobs = {name: _launch(name, port, tmp_path) for name in NAMES}
    try:
        paused = _wait_for(tmp_path, "paused", FIRST_WORLD, jobs)
        starts = [r for r in _records(tmp_path) if r["event"] == "start" and r["restart"] == 0]
        assert sorted(r["rank"] for r in starts) == [0, 1, 2]
        assert {r["world"] for r in starts} == {FIRST_WORLD}
        assert len(paused) == FIRST_WORLD
        rank_of = {r["launcher"]: r["rank"] for r in starts}
        victim = next(name for name, rank in rank_of.items() if rank == 2)
        if victim == NAMES[0]:  # the store host must live: lose rank 1 instead (pids wrapped)
            victim = next(name for name, rank in rank_of.items() if rank == 1)
        os.killpg(jobs[victim].pid, signal.SIGKILL)
        jobs[victim].wait()
        (tmp_path / "logs" / "go").touch()
        survivors = {name: job for name, job in jobs.items() if name != victim}
        codes = {name: job.wait(timeout=800) for name, job in survivors.items()}
    finally:
        for job in jobs.values():
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    outputs = {name: (tmp_path / f"{name}.out").read_text(errors="replace") for name in NAMES}
    assert codes == dict.fromkeys(survivors, 0), {n: outputs[n][-6000:] for n in survivors}

    records = _records(tmp_path)
    restarted = [r for r in records if r["event"] == "start" and r["restart"] == 1]
    assert sorted(r["rank"] for r in restarted) == [0, 1]
    assert {r["world"] for r in restarted} == {2}
    assert {r["launcher"] for r in restarted} == set(survivors)
    assert {r["resumed_from"] for r in restarted} == {"checkpoint_0"}
    assert {r["steps"] for r in restarted} == {SAVE_EVERY}
    done = [r for r in records if r["event"] == "done"]
    assert sorted((r["restart"], r["world"], r["rank"]) for r in done) == [(1, 2, 0), (1, 2, 1)]

    reference = next(r["order"] for r in records if r["event"] == "reference")
    steps = [r for r in records if r["event"] == "step"]
    first = [i for r in steps if r["restart"] == 0 for i in r["ids"]]
    assert first == reference[0][: PAUSE_AT * BATCH * FIRST_WORLD]  # the uninterrupted order
    saved = SAVE_EVERY * BATCH * FIRST_WORLD  # samples consumed when the checkpoint was saved
    rest = [i for r in steps if r["restart"] == 1 and r["epoch"] == 0 for i in r["ids"]]
    assert rest == reference[0][saved:]
    assert sorted(first[:saved] + rest) == list(range(SAMPLES))  # none twice, none lost
    epoch1 = [i for r in steps if r["restart"] == 1 and r["epoch"] == 1 for i in r["ids"]]
    assert epoch1 == reference[1]
