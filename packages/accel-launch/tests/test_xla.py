"""The XLA path: torch_xla's launcher calls the script's main function (xla leg only)."""

import importlib.util
import os

import pytest
from launch_helpers import SCRIPTS, accel_cmd, clean_env, run


def xla_env():
    return clean_env(PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))


@pytest.mark.xla
@pytest.mark.parametrize("processes", [["--num_processes", "1"], []])
def test_tpu_flag_calls_main_through_torch_xla(processes):
    result = run(
        accel_cmd("launch", "--tpu", *processes, str(SCRIPTS / "xla_worker.py"), "hello"),
        env=xla_env(),
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "xla worker ordinal 0 of 1 argv ['hello'] state XLA 0/1 xla" in result.stdout


@pytest.mark.xla(min_devices=2)
def test_tpu_flag_starts_one_process_per_device():
    result = run(
        accel_cmd("launch", "--tpu", str(SCRIPTS / "xla_worker.py")), env=xla_env(), timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("xla worker")]
    count = len(lines)
    assert count >= 2
    for ordinal in range(count):
        expected = (
            f"xla worker ordinal {ordinal} of {count} argv [] state XLA {ordinal}/{count} xla"
        )
        assert expected in lines


@pytest.mark.xla
def test_env_reports_torch_xla():
    import torch_xla

    result = run(accel_cmd("env"), env=xla_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"torch_xla: {torch_xla.__version__}" in result.stdout
    assert "PJRT_DEVICE: " + xla_env()["PJRT_DEVICE"] in result.stdout


@pytest.mark.xla
def test_missing_training_function_is_explained(tmp_path):
    script = tmp_path / "no_main.py"
    script.write_text("x = 1\n")
    result = run(
        accel_cmd(
            "launch",
            "--tpu",
            "--num_processes",
            "1",
            "--main_training_function",
            "train",
            str(script),
        ),
        env=xla_env(),
        timeout=240,
    )
    assert result.returncode != 0
    assert "has no function 'train'" in result.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed"
)
def test_tpu_without_torch_xla_names_the_extra():
    result = run(accel_cmd("launch", "--tpu", str(SCRIPTS / "xla_worker.py")), timeout=60)
    assert result.returncode == 1
    assert "needs torch_xla" in result.stderr and "accel-launch[xla]" in result.stderr


DOWNCAST_SCRIPT = """
import os
import torch
import torch_xla.core.xla_model as xm

def main():
    value = torch.tensor([1 + 2**-10], device=xm.xla_device())  # not representable in bfloat16
    print("downcast", os.environ.get("XLA_DOWNCAST_BF16"), (value * 1.0).cpu().item(), flush=True)
"""


@pytest.mark.xla
def test_downcast_bf16_makes_xla_compute_float32_in_bfloat16(tmp_path):
    script = tmp_path / "downcast.py"
    script.write_text(DOWNCAST_SCRIPT)
    outputs = []
    for extra in ([], ["--downcast-bf16"]):
        flags = ["--tpu", "--num_processes", "1", "--mixed_precision", "bf16", *extra]
        result = run(accel_cmd("launch", *flags, str(script)), env=xla_env(), timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs.append(next(ln for ln in result.stdout.splitlines() if ln.startswith("downcast")))
    assert outputs == ["downcast None 1.0009765625", "downcast 1 1.0"]
