"""Kubeflow's ``PET_*`` variables (torchrun's flags as variables) read by ``accel launch``."""

import json
import os
import signal
import subprocess

import pytest
from launch_helpers import SCRIPTS, accel_cmd, clean_env, run

from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import build_launch_parser
from accel_launch.plan import build_plan
from accel_state.testing import find_free_port

SCRIPT = str(SCRIPTS / "plain_worker.py")
PET = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "2",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "trainer-node-0-0.trainer",
    "PET_MASTER_PORT": "29400",
}


def plan_with(env, *flags):
    args = build_launch_parser().parse_args(["--cpu", *flags, SCRIPT])
    return build_plan(args, None, {"CUDA_VISIBLE_DEVICES": "", **env})


def test_pet_variables_set_the_machines_processes_rank_and_address():
    plan = plan_with(PET)
    assert (plan.num_machines, plan.num_processes, plan.nproc_per_node) == (2, 4, 2)
    assert plan.machine_rank == 1
    assert plan.rdzv_endpoint == "trainer-node-0-0.trainer:29400"
    assert any("PET_NNODES=2" in note for note in plan.notes)


def test_flags_win_over_pet_variables():
    plan = plan_with(PET, "--machine_rank", "0", "--main_process_port", "29555")
    assert plan.machine_rank == 0 and plan.rdzv_endpoint.endswith(":29555")
    assert plan.num_processes == 4  # the rest still from PET_*


def test_named_process_counts_fall_back_to_accels_default_and_ranges_are_elastic():
    plan = plan_with({**PET, "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "0"})
    assert plan.num_machines == 2 and plan.num_processes == 2  # no GPU: one per machine
    elastic = plan_with({**PET, "PET_NNODES": "1:4", "PET_NODE_RANK": "0"})
    assert (elastic.min_machines, elastic.num_machines, elastic.rdzv_backend) == (1, 4, "c10d")
    assert elastic.num_processes == 8 and elastic.nproc_per_node == 2
    with pytest.raises(LaunchArgumentError, match=r"PET_NNODES='4:1'.*--num_machines"):
        plan_with({**PET, "PET_NNODES": "4:1"})
    with pytest.raises(LaunchArgumentError, match=r"PET_NODE_RANK='x'.*--machine_rank"):
        plan_with({**PET, "PET_NODE_RANK": "x"})


def test_two_launchers_with_only_pet_variables_form_one_four_process_job(tmp_path):
    pet = {**PET, "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(find_free_port())}
    command = accel_cmd("launch", "--cpu", SCRIPT, str(tmp_path))
    other = subprocess.Popen(
        command,
        env=clean_env(**pet),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        result = run(command, env=clean_env(**{**pet, "PET_NODE_RANK": "0"}), timeout=120)
        _, other_err = other.communicate(timeout=60)
    finally:
        if other.poll() is None:
            os.killpg(other.pid, signal.SIGKILL)
    assert result.returncode == 0, result.stderr
    assert other.returncode == 0, other_err
    records = {path.name: json.loads(path.read_text()) for path in tmp_path.glob("rank*.json")}
    assert sorted(records) == [f"rank{rank}.json" for rank in range(4)]
    for name, record in records.items():
        assert record["torchrun"]["WORLD_SIZE"] == "4" and record["rank_sum"] == 6.0
        assert record["torchrun"]["GROUP_RANK"] == (
            "0" if name in ("rank0.json", "rank1.json") else "1"
        )
