"""Helpers for running the CLI in subprocesses with hard timeouts and checking for survivors."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SCRIPTS = TESTS / "scripts"
DATA = TESTS / "data"
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


_EMPTY_HF_HOME = tempfile.mkdtemp(prefix="accel_launch_tests_hf_")
atexit.register(shutil.rmtree, _EMPTY_HF_HOME, True)


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without launcher variables, one OMP thread, plus ``extra``.

    ``HF_HOME`` points at an empty folder, so no default config of the machine leaks into a test.
    """
    env = {key: value for key, value in os.environ.items() if key not in TORCHRUN_VARS}
    env = {key: value for key, value in env.items() if not key.startswith("ACCEL_")}
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HOME"] = _EMPTY_HF_HOME
    env.update(extra)
    return env


def accel_cmd(*args: str) -> list[str]:
    """``accel ARGS`` run through the current interpreter."""
    return [sys.executable, "-m", "accel_launch.cli", *args]


def run(
    cmd: list[str],
    timeout: float = 90,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own session; on timeout kill the whole group and fail the test."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def start(
    cmd: list[str], env: dict[str, str], stdout: int | None = subprocess.PIPE
) -> subprocess.Popen[str]:
    """Start ``cmd`` in its own session (stderr piped, text mode) for a test that signals it."""
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not Path("/proc").is_dir()
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_dead(pids: list[int], seconds: float = 10) -> list[int]:
    """Wait up to ``seconds`` for ``pids`` to end; return the ones still alive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        survivors = [pid for pid in pids if alive(pid)]
        if not survivors:
            return []
        time.sleep(0.1)
    survivors = [pid for pid in pids if alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def read_pids(folder: Path) -> list[int]:
    """Pids the workers wrote so far (a file just created and still empty is not one yet)."""
    texts = [path.read_text().strip() for path in folder.glob("*.pid")]
    return [int(text) for text in texts if text]
