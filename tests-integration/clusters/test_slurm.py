"""Real SLURM jobs on a one-node cluster (``nox -s slurm`` starts it and sets ``SLURM_CONF``).

Each test submits real jobs with ``sbatch``/``srun``; the training script is the fault-tolerance
example through ``scripts/long_job.py`` (24 steps of a tiny model on 2 CPU processes). Launch
shape: ``srun --ntasks=2 python train.py`` (SLURM starts both processes); ``srun accel launch``
runs across two nodes in ``test_slurm_two_nodes.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
LONG_JOB = HERE.parent / "scripts" / "long_job.py"
JOB_TIMEOUT = 300

if not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
    pytest.skip(
        "needs a running SLURM cluster (SLURM_CONF and sbatch): run `nox -s slurm`",
        allow_module_level=True,
    )

# `srun accel launch` preempted and requeued runs on two nodes in test_slurm_two_nodes.py (one
# launcher per node), which covers the one-node shape.
SHAPES = {
    "srun_python": ("#SBATCH --ntasks=2", "srun --ntasks=2 {python} {script} --requeue_exit"),
}
#: Jobs submitted by this module, for the session's report.
SUBMITTED: list[str] = []


@pytest.fixture(scope="module")
def job_env(tmp_path_factory) -> dict[str, str]:
    from accel_state.testing.environ import without_launcher_variables

    env = {
        name: value
        for name, value in without_launcher_variables(os.environ).items()
        if not name.startswith("SLURM_") or name == "SLURM_CONF"
    }
    env.update(
        HF_HOME=str(tmp_path_factory.mktemp("hf_home")), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"
    )
    return env


def _command(*args: str, env: dict[str, str], timeout: float = 30) -> str:
    result = subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"
    return result.stdout


def submit(folder: Path, shape: str, env: dict[str, str], *script_args: str) -> str:
    """``sbatch`` a job running the long job in ``shape``; return its id."""
    header, line = SHAPES[shape]
    accel = Path(sys.executable).with_name("accel")
    command = line.format(python=sys.executable, accel=accel, script=LONG_JOB)
    batch = folder / "job.sbatch"
    batch.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=train\n"
        f"{header}\n"
        f"#SBATCH --output={folder}/slurm-%j.out\n"
        "#SBATCH --open-mode=append\n"
        f"#SBATCH --chdir={folder}\n"
        f"{command} {' '.join(script_args)}\n"
    )
    job_id = _command("sbatch", "--parsable", str(batch), env=env).strip().split(";")[0]
    SUBMITTED.append(job_id)
    return job_id


def job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...)."""
    text = _command("scontrol", "show", "job", "--oneliner", job_id, env=env)
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def wait_finished(job_id: str, env: dict[str, str], folder: Path) -> dict[str, str]:
    """Wait until the job has ended for good (a requeue is not an end)."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        fields = job_fields(job_id, env)
        if fields["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return fields
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env, timeout=30, check=False)
    pytest.fail(f"job {job_id} did not end in {JOB_TIMEOUT} s:\n{output(folder)[-3000:]}")


def output(folder: Path) -> str:
    return "".join(path.read_text() for path in sorted(folder.glob("slurm-*.out")))


def weights(project: Path) -> dict[str, torch.Tensor]:
    return load_file(str(project / "final" / "model.safetensors"))


def bit_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return sorted(first) == sorted(second) and all(torch.equal(first[k], second[k]) for k in first)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, job_env) -> dict[str, torch.Tensor]:
    """``srun --ntasks=2 python train.py`` to the end: 2 processes, the reference weights."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    job_id = submit(folder, "srun_python", job_env, "--project_dir", str(folder / "project"))
    fields = wait_finished(job_id, job_env, folder)
    log = output(folder)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert sorted(re.findall(r"WORLD rank (\d) of 2 \(MULTI_CPU\), restart_count 0", log)) == [
        "0",
        "1",
    ], log[-3000:]
    return weights(folder / "project")


@pytest.mark.timeout(2 * JOB_TIMEOUT)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_scancel_signal_term_saves_exits_75_requeues_and_ends_bit_equal(
    tmp_path, job_env, uninterrupted, shape
):
    project = tmp_path / "project"
    job_id = submit(tmp_path, shape, job_env, "--step_delay", "0.3", "--project_dir", str(project))
    deadline = time.monotonic() + JOB_TIMEOUT
    first = project / "checkpoints" / "checkpoint_0"
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), f"training never reached its first checkpoint:\n{output(tmp_path)}"
    # What a preempting scheduler does: SIGTERM to every process of the job's steps.
    _command("scancel", "--signal=TERM", job_id, env=job_env)
    fields = wait_finished(job_id, job_env, tmp_path)
    log = output(tmp_path)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    assert fields["Restarts"] == "1", log[-4000:]  # requeued once, after exiting 75
    assert "stopped by SIGTERM" not in log, log[-4000:]
    stopped = re.search(r"SIGTERM: saved after step (\d+)", log)
    assert stopped, log[-4000:]
    step = int(stopped.group(1))
    assert 5 <= step < 24  # mid-training, after the first checkpoint
    # Both ranks of the requeued run know it is a restart (SLURM_RESTART_COUNT=1).
    restarted = re.findall(r"WORLD rank (\d) of 2 \(MULTI_CPU\), restart_count 1", log)
    assert sorted(restarted) == ["0", "1"], log[-4000:]
    assert f"attempt 1: resumed at epoch {(step - 1) // 8}, step {step}" in log, log[-4000:]
    assert bit_equal(weights(project), uninterrupted)


@pytest.mark.timeout(120)
def test_a_two_task_step_named_bash_is_an_error_not_two_unrelated_runs(tmp_path, job_env):
    code = "from accel_state import PartialState; PartialState(cpu=True)"
    result = subprocess.run(
        ["srun", "--ntasks=2", "bash", "-c", f"{sys.executable} -c '{code}'"],
        env=job_env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=tmp_path,
    )
    SUBMITTED.append("srun")
    assert result.returncode != 0
    assert "SLURM_STEP_NUM_TASKS=2" in result.stderr and "--job-name" in result.stderr
