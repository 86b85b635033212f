"""Run a script or module under ``torchrun`` in a subprocess, with a hard timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from accel_state.contract import USE_CPU
from accel_state.testing.environ import without_launcher_variables
from accel_state.testing.ports import find_free_port


def run_torchrun(
    target: Sequence[str],
    nproc_per_node: int,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    use_cpu: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m torch.distributed.run --nproc_per_node N <target...>`` and capture output.

    Args:
        target: What follows torchrun's own flags, e.g. ``["-m", "pkg.mod"]`` or ``["script.py", "--x"]``.
        nproc_per_node: Number of processes.
        timeout: Seconds before the whole process tree is killed (``subprocess.TimeoutExpired``).
        env: Extra environment variables.
        cwd: Working directory.
        use_cpu: Set ``ACCEL_USE_CPU=true`` so accel code in the job runs on the CPU over gloo
            even on a machine with GPUs; pass ``False`` for tests of accelerator choice.

    """
    environ = {
        **without_launcher_variables(os.environ, drop_accel=False),
        "OMP_NUM_THREADS": "1",
        **({USE_CPU: "true"} if use_cpu else {}),
        **(dict(env) if env else {}),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc_per_node),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(find_free_port()),
        *target,
    ]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
        cwd=cwd,
        check=False,
        start_new_session=True,
    )
