"""Helpers for end-to-end tests that go through the real ``accel`` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_state.testing import find_free_port
from accel_state.testing.environ import without_launcher_variables

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
EXAMPLES = HERE.parent / "examples"


def accel_command() -> list[str]:
    """The ``accel`` console script installed beside this interpreter."""
    script = Path(sys.executable).with_name("accel")
    if not script.exists():
        pytest.fail(f"the accel console script is not installed next to {sys.executable}")
    return [str(script)]


@pytest.fixture
def clean_env(tmp_path):
    """Environment for launched jobs: no user config file, one thread per process."""
    env = without_launcher_variables(os.environ)
    env.update(HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def run_accel(
    args: list[str], env: dict[str, str], timeout: float = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``accel <args>`` to completion with a hard timeout."""
    return subprocess.run(
        [*accel_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
        start_new_session=True,
    )


def launch(
    script: str | Path,
    *script_args: str,
    env: dict[str, str],
    processes: int = 2,
    flags: tuple[str, ...] = (),
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """``accel launch --cpu --num_processes N [flags] script [args]``."""
    return run_accel(
        ["launch", "--cpu", "--num_processes", str(processes), *flags, str(script), *script_args],
        env=env,
        timeout=timeout,
    )


def marked_lines(output: str, marker: str) -> list[str]:
    """The lines starting with ``marker`` (without it)."""
    return [line[len(marker) :].strip() for line in output.splitlines() if line.startswith(marker)]


__all__ = ["EXAMPLES", "SCRIPTS", "find_free_port", "launch", "marked_lines", "run_accel"]
