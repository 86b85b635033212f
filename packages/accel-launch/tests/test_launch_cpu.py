"""Real launches on CPU (gloo), each under a hard timeout."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import (
    SCRIPTS,
    accel_cmd,
    alive,
    clean_env,
    read_pids,
    run,
    start,
    wait_dead,
)

from accel_state.contract import MIXED_PRECISION, REQUEUE_EXIT_CODE, USE_CPU
from accel_state.testing import find_free_port


def records(folder, pattern="rank*.json"):
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob(pattern))}


def test_two_processes_plain_torch_script_with_args(tmp_path):
    env = clean_env()
    env.pop("OMP_NUM_THREADS")
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--mixed_precision",
            "bf16",
            str(SCRIPTS / "plain_worker.py"),
            str(tmp_path),
            "--lr",
            "0.1",
            "pos",
        ),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    got = records(tmp_path)
    assert sorted(got) == ["rank0.json", "rank1.json"]
    for rank, record in enumerate(got.values()):
        assert record["argv"] == ["--lr", "0.1", "pos"]
        assert record["torchrun"]["RANK"] == str(rank) and record["torchrun"]["WORLD_SIZE"] == "2"
        assert record["rank_sum"] == 1.0
        assert record["env"][MIXED_PRECISION] == "bf16" and record["env"][USE_CPU] == "true"
        expected_threads = max(1, len(os.sched_getaffinity(0)) // 2)
        assert record["env"]["OMP_NUM_THREADS"] == str(expected_threads)


def test_three_processes_from_config_file_with_flag_overrides_and_logs(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nuse_cpu: true\n"
        "num_processes: 2\nmixed_precision: fp16\ngradient_accumulation_steps: 4\n"
    )
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    flags = ["--config_file", str(config), "--num_processes", "3", "--mixed_precision", "bf16"]
    flags += ["--tee", "3", "--log_dir", str(logs)]
    script = [str(SCRIPTS / "accel_worker.py"), str(out), "--x"]
    result = run(accel_cmd("launch", *flags, *script))
    assert result.returncode == 0, result.stderr
    got = records(out)
    assert sorted(record["rank"] for record in got.values()) == [0, 1, 2]
    for record in got.values():
        assert record["world"] == 3 and record["rank_sum"] == 3.0 and record["argv"] == ["--x"]
        assert record["mixed_precision"] == "bf16"  # the flag beats the file
        assert record["accumulation"] == 4 and record["use_cpu"]  # from the file
    assert list(logs.rglob("stdout.log")) and list(logs.rglob("stderr.log"))


def test_module_flag_and_accel_launch_entry_point(tmp_path):
    code = "import sys; from accel_launch.cli import launch_main; sys.exit(launch_main())"
    result = run(
        [
            sys.executable,
            "-c",
            code,
            "--cpu",
            "--num_processes",
            "2",
            "-m",
            "echo_module",
            str(tmp_path),
            "-x",
        ],
        cwd=SCRIPTS,
    )
    assert result.returncode == 0, result.stderr
    got = records(tmp_path, "module_rank*.json")
    assert sorted(got) == ["module_rank0.json", "module_rank1.json"]
    assert all(record == {"argv": ["-x"], "name": "__main__"} for record in got.values())


def test_single_process_runs_the_script_directly(tmp_path):
    env = clean_env(PLAIN_WORKER_EXIT="3")
    env.pop("OMP_NUM_THREADS")
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num-processes",  # Accelerate's hyphenated spelling
            "1",
            str(SCRIPTS / "plain_worker.py"),
            str(tmp_path),
            "a",
        ),
        env=env,
    )
    assert result.returncode == 3, result.stderr
    record = records(tmp_path)["rank0.json"]
    assert record["torchrun"]["RANK"] is None and record["rank_sum"] is None
    assert record["argv"] == ["a"] and record["env"][USE_CPU] == "true"
    # Threads as for several processes: every core for the one local process.
    assert record["env"]["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


@pytest.mark.torch_feature("failure_summary_every_rank")
def test_the_rank_that_raised_first_is_named_even_when_a_peer_exits_before_it():
    # Rank 1 raises, then lingers while exiting; rank 0's barrier breaks and it exits first.
    result = run(
        accel_cmd(
            "launch", "-q", "--cpu", "--num_processes", "2", str(SCRIPTS / "cause_reported_late.py")
        ),
        timeout=180,
    )
    assert result.returncode == 1, result.stderr
    summary = result.stderr[result.stderr.index("accel launch: the job failed.") :]
    assert "rank 1 (local rank 1" in summary
    first_line = next(line for line in summary.splitlines() if "(first failure)" in line)
    assert first_line.lstrip().startswith("rank 1 ")
    consequence = next(line for line in summary.splitlines() if line.lstrip().startswith("rank 0 "))
    assert "a consequence" in consequence
    assert "Traceback of rank 1:" in summary
    assert summary.rstrip().endswith("RuntimeError: the real cause, on rank 1")


def test_failing_rank_ends_the_job_quickly_with_traceback(tmp_path):
    started = time.monotonic()
    result = run(
        accel_cmd(
            "launch",
            "-q",
            "--cpu",
            "--num_processes",
            "2",
            str(SCRIPTS / "fail_worker.py"),
            str(tmp_path),
        ),
        timeout=150,
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "RuntimeError: boom from rank 1" in result.stderr
    assert "Traceback" in result.stderr
    assert "rank 1 (local rank 1" in result.stderr and "first failure" in result.stderr
    assert "accel launch: starting" not in result.stderr  # -q
    # Rank 0 would sleep 120 s: ending well before that shows the job did not wait for it.
    assert elapsed < 90, f"job took {elapsed:.1f}s to end"
    pids = read_pids(tmp_path)
    assert len(pids) == 2
    assert wait_dead(pids, 5) == []


def test_sigterm_stops_every_worker(tmp_path):
    proc, pids = _start_sleepers(tmp_path, 2, seconds=60)
    try:
        assert len(pids) == 2
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == REQUEUE_EXIT_CODE, err  # preemption: asks for a requeue
    assert "got SIGTERM" in err
    assert wait_dead(pids, 5) == []


def test_two_machines_on_localhost_form_one_job(tmp_path):
    port = str(find_free_port())
    common = [
        "launch",
        "--cpu",
        "--num_processes",
        "4",
        "--num_machines",
        "2",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        port,
    ]
    script = [str(SCRIPTS / "plain_worker.py"), str(tmp_path)]
    other = start(
        accel_cmd(*common, "--machine_rank", "1", *script),
        clean_env(),
    )
    try:
        result = run(accel_cmd(*common, "--machine_rank", "0", *script), timeout=90)
        _, other_err = other.communicate(timeout=30)
    finally:
        if other.poll() is None:
            os.killpg(other.pid, signal.SIGKILL)
    assert result.returncode == 0, result.stderr
    assert other.returncode == 0, other_err
    got = records(tmp_path)
    assert sorted(got) == [f"rank{r}.json" for r in range(4)]
    for name, record in got.items():
        assert record["torchrun"]["WORLD_SIZE"] == "4" and record["rank_sum"] == 6.0
        assert record["torchrun"]["GROUP_RANK"] == (
            "0" if name in ("rank0.json", "rank1.json") else "1"
        )


def test_max_restarts_recovers_a_worker_that_fails_once(tmp_path):
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--max_restarts",
            "1",
            str(SCRIPTS / "flaky_worker.py"),
            str(tmp_path),
        ),
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "failed_once").exists()
    done = sorted(path.read_text() for path in tmp_path.glob("rank*.done"))
    assert done == ["2.0 restart=1", "2.0 restart=1"]
    # Rank 0 was blocked in the rendezvous (C++) when the launcher stopped it for the restart:
    # it could not run Python's SIGTERM handler, so the watchdog ended it (torch elastic would
    # otherwise wait 30 s, then SIGKILL it without a word).
    output = result.stdout + result.stderr
    assert "stopped by SIGTERM" in output and "while blocked at flaky_worker.py:" in output
    assert "forcefully exiting via 9" not in output


def _start_sleepers(
    tmp_path: Path, processes: int, seconds: float
) -> tuple[subprocess.Popen[str], list[int]]:
    """Launch ``sleep_worker.py`` on ``processes`` ranks; wait up to ``seconds`` for their pids.

    One process uses the launcher's default (no ``--num_processes``), the single-process path.
    """
    count = ["--num_processes", str(processes)] if processes > 1 else []
    proc = start(
        accel_cmd("launch", "--cpu", *count, str(SCRIPTS / "sleep_worker.py"), str(tmp_path)),
        clean_env(),
    )
    deadline = time.monotonic() + seconds
    while len(read_pids(tmp_path)) < processes and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, read_pids(tmp_path)


def test_single_process_ctrl_c_reaches_the_script(tmp_path):
    proc, pids = _start_sleepers(tmp_path, 1, seconds=30)
    try:
        assert len(pids) == 1
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "KeyboardInterrupt" in err
    assert proc.returncode == 128 + signal.SIGINT
    assert wait_dead(pids, 5) == []


def test_single_process_sigterm_is_passed_on(tmp_path):
    proc, pids = _start_sleepers(tmp_path, 1, seconds=30)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == REQUEUE_EXIT_CODE  # SIGTERM means preemption: requeue
    assert wait_dead(pids, 5) == []


def test_no_python_runs_a_program_on_every_rank(tmp_path):
    shell = 'echo "$RANK $WORLD_SIZE" > "$0/r$RANK"'
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--no_python",
            "sh",
            "-c",
            shell,
            str(tmp_path),
        )
    )
    assert result.returncode == 0, result.stderr
    assert sorted(path.read_text() for path in tmp_path.iterdir()) == ["0 2\n", "1 2\n"]
    single = run(accel_cmd("launch", "--cpu", "--no_python", "sh", "-c", "exit 4"))
    assert single.returncode == 4


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_waiting_for_other_machines_ends_the_launcher(tmp_path, signum):
    flags = [
        "--cpu",
        "--num_processes",
        "4",
        "--num_machines",
        "2",
        "--main_process_ip",
        "127.0.0.1",
    ]
    flags += ["--main_process_port", str(find_free_port())]
    proc = start(
        accel_cmd("launch", *flags, str(SCRIPTS / "sleep_worker.py"), str(tmp_path)),
        clean_env(TMPDIR=str(tmp_path)),
        stdout=subprocess.DEVNULL,  # where a launcher killed early leaves its log folder
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while len(lines) < 20 and not any("starting 2 process(es)" in line for line in lines):
            lines.append(proc.stderr.readline())  # torch may warn first (numpy missing...)
        assert "on machine 0 of 2" in lines[-1], lines
        time.sleep(1.0)  # now blocked in the rendezvous, waiting for machine 1
        proc.send_signal(signum)
        proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signum
    assert read_pids(tmp_path) == []


@pytest.mark.parametrize("processes", [1, 2])
def test_workers_die_when_the_launcher_is_killed_with_sigkill(tmp_path, processes):
    # torch's elastic agent puts each worker in a session of its own; without the parent-death
    # guard a SIGKILLed launcher (no cleanup possible) would leave them running.
    proc, pids = _start_sleepers(tmp_path, processes, seconds=60)
    try:
        assert len(pids) == processes
        proc.kill()  # the launcher only, not its process group
        proc.wait(timeout=10)
        assert wait_dead(pids, 10) == []
    finally:
        for pid in read_pids(tmp_path):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.torch_feature("failure_summary_every_rank")
def test_the_failure_summary_puts_every_ranks_position_side_by_side(tmp_path):
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            str(SCRIPTS / "reports_position.py"),
            str(tmp_path),
        ),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert (
        "Where the ranks were: rank 0 waits in fake_op #10 (reports_position.py:0); "
        "rank 1 waits in fake_op #11 (reports_position.py:1)"
    ) in result.stderr
    # Rank 1 was stopped by the launcher's SIGTERM: its error file was still written.
    assert "stopped by SIGTERM" in result.stderr and "reports_position.py:" in result.stderr


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_reaches_every_worker_which_saves_and_the_launcher_asks_for_a_requeue(
    tmp_path, processes
):
    count = ["--num_processes", str(processes)] if processes > 1 else []
    proc = start(
        accel_cmd("launch", "--cpu", *count, str(SCRIPTS / "preemptible.py"), str(tmp_path)),
        clean_env(),
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while len(read_pids(tmp_path)) < processes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(read_pids(tmp_path)) == processes
        proc.send_signal(signal.SIGTERM)  # what a scheduler sends before it kills the job
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    assert "requeue" in err
    saved = sorted(path.read_text() for path in tmp_path.glob("saved*"))
    assert saved == ["saved after SIGTERM"] * processes
