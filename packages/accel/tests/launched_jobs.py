"""Start training scripts through ``accel launch`` from tests, side by side, and read their reports.

Each job runs in its own session (a hang is killed with its whole process group) with the
launcher's variables of the test process removed, and writes a JSON report that the test reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accel_state.testing.environ import without_launcher_variables

#: Per job: the ``accel launch`` flags and the script's own arguments.
Jobs = dict[str, tuple[list[str], list[str]]]


def start(
    script: Path,
    flags: Sequence[str],
    script_args: Sequence[str],
    processes: int = 2,
    cpu: bool = True,
) -> subprocess.Popen[str]:
    """Start ``accel launch [--cpu] --num_processes N FLAGS SCRIPT ARGS`` in its own session."""
    env = without_launcher_variables(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if cpu:
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "accel-torch-extensions"))
    # The module, not the `accel` console script: a GPU machine's --target install has no scripts.
    command = [sys.executable, "-m", "accel_launch.cli", "launch"]
    command += [*(["--cpu"] if cpu else []), "--num_processes", str(processes)]
    command += [*flags, str(script), *script_args]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def finish(job: subprocess.Popen[str], report: Path, timeout: float = 900) -> dict[str, Any]:
    """Wait for a started job (killing its process group past ``timeout``); its JSON report.

    A job that failed or hung gives ``{"failed": <reason and the end of its output>}``.
    """
    try:
        output, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, 9)
        output, _ = job.communicate()
        return {"failed": f"timed out after {timeout} s\n{output[-6000:]}"}
    except BaseException:  # pytest's own timeout, Ctrl-C: no job outlives the test
        os.killpg(job.pid, 9)
        raise
    if job.returncode != 0 or not report.exists():
        return {"failed": f"exit {job.returncode}\n{output[-8000:]}"}
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def run_waves(
    script: Path,
    root: Path,
    waves: list[Jobs],
    report_flag: str = "--out",
    processes: Mapping[str, int] | None = None,
    timeouts: Mapping[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run each wave's jobs side by side (they mostly wait on imports and rendezvous).

    Job ``name`` writes its report to ``root/<name>.json`` (passed as ``report_flag PATH``),
    runs on ``processes[name]`` processes (default 2) and is killed after ``timeouts[name]``
    seconds (default 900).
    """
    counts = processes or {}
    limits = timeouts or {}
    reports: dict[str, dict[str, Any]] = {}
    for wave in waves:
        started = {
            name: start(
                script,
                flags,
                [*args, report_flag, str(root / f"{name}.json")],
                counts.get(name, 2),
            )
            for name, (flags, args) in wave.items()
        }
        try:
            for name, job in started.items():
                reports[name] = finish(job, root / f"{name}.json", limits.get(name, 900))
        finally:  # a test stopped while waiting on one job stops the others too
            for job in started.values():
                if job.poll() is None:
                    os.killpg(job.pid, 9)
    return reports
