"""The launch helpers re-exported by accel.utils, and the launch flags a worker's Accelerator reads."""

from pathlib import Path

import pytest
from launched_jobs import finish, start

import accel.utils
import accel.utils.environment
import accel.utils.launch
import accel_launch.affinity
import accel_launch.environment
import accel_launch.launch_helpers

SCRIPT = Path(__file__).with_name("launch_surface_script.py")
LAUNCH_NAMES = {
    "PrepareForLaunch": accel_launch.launch_helpers,
    "prepare_simple_launcher_cmd_env": accel_launch.launch_helpers,
    "prepare_multi_gpu_env": accel_launch.launch_helpers,
    "prepare_deepspeed_cmd_env": accel_launch.launch_helpers,
    "prepare_tpu": accel_launch.launch_helpers,
    "prepare_sagemager_args_inputs": accel_launch.launch_helpers,
    "convert_dict_to_env_variables": accel.utils.environment,  # warns on Accelerate's logger path
    "purge_accelerate_environment": accel_launch.environment,
    "get_cpu_distributed_information": accel_launch.affinity,
    "set_numa_affinity": accel_launch.affinity,
}


def test_launch_helpers_are_reexported_from_accel_utils():
    for name, home in LAUNCH_NAMES.items():
        assert getattr(accel.utils, name) is getattr(home, name), name
        assert getattr(accel.utils.launch, name) is getattr(home, name), name
        assert name in accel.utils.__all__
    assert accel.utils.environment.purge_accelerate_environment is (
        accel_launch.environment.purge_accelerate_environment
    )
    lines = accel.utils.environment.convert_dict_to_env_variables({"A": "1", "B": "x y"})
    assert lines == accel_launch.environment.convert_dict_to_env_variables({"A": "1"})
    info = accel.utils.environment.get_cpu_distributed_information()
    assert isinstance(info, accel.utils.environment.CPUInformation)


@pytest.mark.timeout(600)
def test_regional_compilation_flag_compiles_the_blocks_of_a_two_process_job(tmp_path):
    report = tmp_path / "report.json"
    job = start(
        SCRIPT,
        [
            "--dynamo_backend",
            "EAGER",
            "--dynamo_use_regional_compilation",
            "--enable_cpu_affinity",
            "--env",
            "GREETING=hi",
        ],
        ["--out", str(report)],
    )
    found = finish(job, report, timeout=540)
    assert "failed" not in found, found.get("failed")
    assert found["regional"] is True and found["backend"].lower().endswith("eager")
    assert found["compiled_regions"] is True
    assert found["blocks_compiled"] == [True, True]
    assert found["losses_finite"] and found["eval_rows"] == 4
    assert found["greeting"] == "hi" and found["num_processes"] == 2
