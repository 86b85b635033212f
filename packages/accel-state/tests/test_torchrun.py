"""Plain torchrun (no accel launcher) must produce one job, not N single processes."""

import textwrap

import pytest

from accel_state.testing import run_torchrun


@pytest.mark.parametrize("nproc", [2, 3])
def test_torchrun_hello_is_one_multi_cpu_job(nproc):
    result = run_torchrun(["-m", "accel_state.hello"], nproc_per_node=nproc, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"hello from {nproc} processes (MULTI_CPU, backend gloo)" in result.stdout
    assert "ok" in result.stdout
    assert result.stdout.count(f"MULTI_CPU on cpu, {nproc} processes") == nproc


def test_malformed_variable_reaches_the_user_clearly(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            from accel_state import PartialState
            PartialState()
            """
        )
    )
    result = run_torchrun(
        [str(script)], nproc_per_node=2, timeout=120, env={"ACCEL_MIXED_PRECISION": "fp64"}
    )
    assert result.returncode != 0
    assert "ACCEL_MIXED_PRECISION='fp64' is not valid" in result.stderr + result.stdout


EXIT_REPORT = """
import atexit

import torch
import torch.distributed as dist

# Registered before PartialState starts the group, so it runs after accel-state's exit hook.
atexit.register(lambda: print(f"EXIT group_alive={dist.is_initialized()}", flush=True))
from accel_state import PartialState

state = PartialState()
dist.all_reduce(torch.ones(1))
if "{mode}" == "raise":
    raise RuntimeError("stopped on purpose")
"""


def test_group_is_destroyed_at_normal_exit(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(EXIT_REPORT.replace("{mode}", "normal"))
    result = run_torchrun([str(script)], nproc_per_node=2, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("EXIT group_alive=False") == 2, result.stdout + result.stderr


def test_group_is_left_alone_after_an_uncaught_exception(tmp_path):
    # Destroying it would wait for pending collectives; the launcher stops the job instead.
    script = tmp_path / "script.py"
    script.write_text(EXIT_REPORT.replace("{mode}", "raise"))
    result = run_torchrun([str(script)], nproc_per_node=2, timeout=120)
    assert result.returncode != 0
    assert "RuntimeError: stopped on purpose" in result.stderr
    # The launcher may stop the second rank before its exit hooks run; any rank that got there
    # must have found its group still alive.
    assert "EXIT group_alive=True" in result.stdout, result.stdout + result.stderr
    assert "EXIT group_alive=False" not in result.stdout


def test_package_declares_torch_as_its_only_dependency():
    import importlib.metadata

    requirements = importlib.metadata.requires("accel-state") or []
    runtime = [r for r in requirements if "extra ==" not in r]
    assert [r.split(">")[0].split("=")[0].strip() for r in runtime] == ["torch"]


def test_kubeflow_pytorchjob_v1_variables_with_plain_python_form_one_job(tmp_path):
    """A v1 PyTorchJob runs ``python train.py`` per pod with four variables and no launcher."""
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from accel_state.testing import find_free_port
    from accel_state.testing.environ import without_launcher_variables

    base = without_launcher_variables(os.environ)
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()), WORLD_SIZE="2")
    base["OMP_NUM_THREADS"] = "1"
    script = str(Path(__file__).with_name("pytorchjob_worker.py"))
    pods = [
        subprocess.Popen(
            [sys.executable, script, str(tmp_path)],
            env={**base, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [pod.communicate(timeout=120) for pod in pods]
    finally:
        for pod in pods:
            if pod.poll() is None:
                os.killpg(pod.pid, signal.SIGKILL)
    for pod, (_, err) in zip(pods, outputs, strict=True):
        assert pod.returncode == 0, err
    for rank in range(2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["num_processes"] == 2 and record["process_index"] == rank
        assert record["distributed_type"] == "MULTI_CPU" and record["rank_sum"] == 1.0
