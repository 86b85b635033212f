"""examples/by_feature/hf_trainer.py as its docstring launches it, then resumed in a new launch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ecosystem_jobs import JOB_TIMEOUT, job_env, require_libraries

require_libraries()

EXAMPLE = Path(__file__).parents[2] / "examples" / "by_feature" / "hf_trainer.py"


def launch(tmp_path: Path, *args: str) -> str:
    accel = str(Path(sys.executable).with_name("accel"))
    command = [accel, "launch", "--as-accelerate", "--cpu", "--num_processes", "2", str(EXAMPLE)]
    completed = subprocess.run(
        [*command, "--output_dir", str(tmp_path / "run"), *args],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        env=job_env(tmp_path),
        cwd=tmp_path,
        check=False,
        start_new_session=True,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-8000:]
    return completed.stdout


def test_the_trainer_example_learns_and_resumes(tmp_path: Path) -> None:
    first = launch(tmp_path, "--epochs", "2")
    accuracies = [float(a) for a in re.findall(r"eval accuracy ([\d.]+)", first)]
    assert len(accuracies) == 2 and accuracies[-1] > 0.9, first
    assert "runs on accelerate 1.15.0+accel." in first and "with 2 processes" in first
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    resumed = launch(tmp_path, "--epochs", "3", "--resume")
    epochs = [int(e) for e in re.findall(r"epoch (\d+) eval accuracy", resumed)]
    assert epochs == [1, 2, 3], resumed  # the first two from the checkpoint's history
    assert re.search(r"best checkpoint \S+checkpoint-\d+", resumed)
