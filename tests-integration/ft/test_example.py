"""examples/by_feature/replica_groups.py as its docstring runs it, then resumed in a fresh launch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_replica_training import JOB_LIMIT, report

EXAMPLE = Path(__file__).parents[2] / "examples" / "by_feature" / "replica_groups.py"


def launch_example(
    project: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    accel = str(Path(sys.executable).with_name("accel"))
    return subprocess.run(
        [accel, "launch", "--cpu", "--ft_replicas", "2", "--num_processes", "2",
         "--max_restarts", "1", str(EXAMPLE), "--project_dir", str(project), *args],
        env=env, capture_output=True, text=True, timeout=JOB_LIMIT, check=False,
        start_new_session=True,
    )  # fmt: skip


def test_the_example_trains_in_two_groups_and_resumes(tmp_path: Path, env: dict[str, str]) -> None:
    project = tmp_path / "run"
    first = launch_example(project, env, "--epochs", "2")
    assert first.returncode == 0, report(first)
    # Each group's main process prints; 512 samples in steps of 2 groups x 2 processes x 8.
    epochs = re.findall(r"epoch (\d): (\d+) committed steps, (\d+) not committed", first.stdout)
    assert sorted(epochs) == sorted([("0", "16", "0"), ("1", "16", "0")] * 2), first.stdout
    assert float(re.findall(r"final eval mse ([\d.]+)", first.stdout)[-1]) < 0.1
    resumed = launch_example(project, env, "--epochs", "3", "--resume")
    assert resumed.returncode == 0, report(resumed)
    assert re.findall(r"epoch (\d):", resumed.stdout) == ["2", "2"], resumed.stdout


DILOCO_EXAMPLE = EXAMPLE.with_name("diloco.py")


def test_the_diloco_example_learns_and_leaves_the_groups_equal(
    tmp_path: Path, env: dict[str, str]
) -> None:
    accel = str(Path(sys.executable).with_name("accel"))
    finished = subprocess.run(
        [accel, "launch", "--cpu", "--ft_replicas", "2", "--num_processes", "1",
         "--max_restarts", "1", str(DILOCO_EXAMPLE), "--sync_every", "10",
         "--samples", "640", "--epochs", "2"],
        env=env, capture_output=True, text=True, timeout=JOB_LIMIT, check=False,
        start_new_session=True, cwd=tmp_path,
    )  # fmt: skip
    assert finished.returncode == 0, report(finished)
    entropy = float(re.findall(r"chain's entropy\): ([\d.]+)", finished.stdout)[0])
    finals = re.findall(r"final eval loss ([\d.]+)", finished.stdout)
    # One line per group, equal: the block's end synced them. An untrained model scores
    # ln(48) = 3.87; the chain's entropy (about 1.52) is the best any model can do.
    assert len(finals) == 2 and finals[0] == finals[1], finished.stdout
    assert entropy < float(finals[0]) < 2.6, finished.stdout
