"""Long jobs survive: restarts that resume bit-exactly, preemption, and hangs that explain themselves.

Every job goes through the real ``accel launch`` on 2 CPU processes. The training script is the
fault-tolerance example (``examples/by_feature/fault_tolerance.py``) run through
``scripts/long_job.py``, which can kill rank 1 with SIGKILL after a given step (first attempt
only) or slow every step down so that a signal lands mid-training.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, accel_command, launch
from safetensors.torch import load_file

STRATEGIES = {
    "ddp": (),
    "fsdp2": ("--use_fsdp", "--fsdp_version", "2"),
    "zero2": ("--use_deepspeed", "--zero_stage", "2"),
}
#: Variants of a strategy: (its strategy, extra script arguments). Saving in the background
#: must end bit-equal to the strategy's uninterrupted run with synchronous saves.
VARIANTS = {
    **{name: (name, ()) for name in STRATEGIES},
    "fsdp2_background_saves": ("fsdp2", ("--background_saves",)),
}
LONG_JOB = SCRIPTS / "long_job.py"
TIMEOUT = 10


@pytest.fixture(scope="module")
def job_env(tmp_path_factory) -> dict[str, str]:
    from accel_state.testing.environ import without_launcher_variables

    env = without_launcher_variables(os.environ)
    env.update(
        HF_HOME=str(tmp_path_factory.mktemp("hf_home")),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        DS_ACCELERATOR="cpu",
    )
    return env


def weights(project: Path) -> dict[str, torch.Tensor]:
    return load_file(str(project / "final" / "model.safetensors"))


def bit_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, job_env) -> dict[str, dict[str, torch.Tensor]]:
    """Final weights of a run that nothing interrupts, per strategy (computed on first use)."""

    class Reference(dict):
        def __missing__(self, strategy: str) -> dict[str, torch.Tensor]:
            project = tmp_path_factory.mktemp(f"reference_{strategy}")
            result = launch(
                LONG_JOB,
                "--project_dir",
                str(project),
                env=job_env,
                flags=STRATEGIES[strategy],
                timeout=400,
            )
            assert result.returncode == 0, result.stderr[-3000:]
            self[strategy] = weights(project)
            return self[strategy]

    return Reference()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_worker_killed_mid_epoch_is_restarted_and_the_job_ends_bit_equal(
    tmp_path, job_env, uninterrupted, variant
):
    strategy, script_args = VARIANTS[variant]
    result = launch(
        LONG_JOB,
        "--die_at_step",
        "7",
        "--project_dir",
        str(tmp_path),
        *script_args,
        env=job_env,
        flags=("--max_restarts", "2", *STRATEGIES[strategy]),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Killed after step 7 of 8 in epoch 0; checkpoint at step 5; the restart resumes there.
    assert "attempt 1: resumed at epoch 0, step 5" in result.stdout, result.stdout[-2000:]
    assert bit_equal(weights(tmp_path), uninterrupted[strategy])


def _start_long_job(project: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``accel launch`` of the long job on 2 processes, slowed to 0.3 s a step, in its own group."""
    command = [*accel_command(), "launch", "--cpu", "--num_processes", "2", str(LONG_JOB)]
    return subprocess.Popen(
        [*command, "--step_delay", "0.3", "--project_dir", str(project)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_first_checkpoint(job: subprocess.Popen[str], project: Path, timeout: float) -> None:
    """Return once the job wrote its first checkpoint (a deadline for hangs, not for speed)."""
    deadline = time.monotonic() + timeout
    first = project / "checkpoints" / "checkpoint_0"
    while not first.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), "training never reached its first checkpoint"


@pytest.mark.timeout(900)
def test_sigterm_to_the_launcher_saves_exits_75_and_a_relaunch_ends_bit_equal(
    tmp_path, job_env, uninterrupted
):
    from accel_state.contract import REQUEUE_EXIT_CODE

    job = _start_long_job(tmp_path, job_env)
    try:
        _wait_for_first_checkpoint(job, tmp_path, timeout=300)
        job.send_signal(signal.SIGTERM)  # the launcher only, as a scheduler would
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == REQUEUE_EXIT_CODE, err[-3000:]
    stopped = re.search(r"SIGTERM: saved after step (\d+)", out)
    assert stopped, out[-2000:]
    step = int(stopped.group(1))
    assert 5 <= step < 24  # mid-training, after the first checkpoint
    resumed = launch(LONG_JOB, "--project_dir", str(tmp_path), env=job_env, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed at epoch {(step - 1) // 8}, step {step}" in resumed.stdout
    assert bit_equal(weights(tmp_path), uninterrupted["ddp"])


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc), as SLURM's process tracking finds them."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers through /proc (Linux)")
def test_sigterm_to_every_process_of_the_job_as_slurm_sends_it_is_one_request(tmp_path, job_env):
    """slurmstepd signals the launcher and the workers; the launcher's copy follows in ms."""
    from accel_state.contract import REQUEUE_EXIT_CODE

    job = _start_long_job(tmp_path, job_env)
    try:
        _wait_for_first_checkpoint(job, tmp_path, timeout=240)
        for pid in [job.pid, *_descendants(job.pid)]:  # the launcher and both workers
            os.kill(pid, signal.SIGTERM)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == REQUEUE_EXIT_CODE, err[-3000:]
    assert "stopped by SIGTERM" not in err, err[-3000:]
    assert re.search(r"SIGTERM: saved after step (\d+)", out), out[-2000:] + err[-2000:]


def _error_files(log_dir: Path) -> dict[int, dict]:
    found = {}
    for path in log_dir.rglob("error.json"):
        rank = int(path.parent.name)  # <log_dir>/<run>/attempt_0/<local rank>/error.json
        found[rank] = json.loads(path.read_text())["message"]["extraInfo"]
    return found


@pytest.mark.timeout(300)
def test_a_skipped_gather_ends_every_rank_with_each_ranks_position(tmp_path, job_env):
    result = launch(
        SCRIPTS / "skips_gather.py",
        env=job_env,
        flags=("--collective_timeout", str(TIMEOUT), "--log_dir", str(tmp_path)),
        timeout=240,
    )
    assert result.returncode != 0
    lines = (SCRIPTS / "skips_gather.py").read_text().splitlines()
    gather = next(n for n, text in enumerate(lines, 1) if text.endswith("# the gather"))
    reduce = next(n for n, text in enumerate(lines, 1) if "went on without the gather" in text)
    summary = next(line for line in result.stderr.splitlines() if "Where the ranks were:" in line)
    assert "rank 0 waits in gather #" in summary and f"(skips_gather.py:{gather}" in summary
    assert "rank 1 waits in reduce #" in summary and f"(skips_gather.py:{reduce}" in summary
    assert "CollectiveTimeoutError" in result.stderr
    # Every rank ended (its error recorded) within the timeout plus 10 s of reaching the hang.
    entered = {
        int(rank): float(when)
        for rank, when in re.findall(r"^ENTER (\d) (\S+)$", result.stdout, re.M)
    }
    ended = {rank: float(info["accel_timestamp"]) for rank, info in _error_files(tmp_path).items()}
    assert sorted(entered) == sorted(ended) == [0, 1], (entered, ended)
    for rank in (0, 1):
        assert ended[rank] - entered[rank] < TIMEOUT + 10, (rank, entered, ended)


@pytest.mark.timeout(300)
def test_save_state_on_the_main_process_only_is_a_clear_error_on_every_rank(tmp_path, job_env):
    result = launch(
        SCRIPTS / "saves_on_main_only.py",
        str(tmp_path / "project"),
        env=job_env,
        flags=("--collective_timeout", str(TIMEOUT)),
        timeout=240,
    )
    assert result.returncode != 0
    advice = "call save_state on every process, not only under `if accelerator.is_main_process:`"
    for rank in (0, 1):
        assert f"[rank{rank}]: save_state is collective: {advice}" in result.stderr, rank
    assert re.search(r"rank 0 waits in save_state #\d+ \(saves_on_main_only\.py:", result.stderr)
    assert not (tmp_path / "project" / "checkpoints").exists()  # nothing half-written
