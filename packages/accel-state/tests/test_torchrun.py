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
