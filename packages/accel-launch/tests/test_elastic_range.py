"""``--num_machines MIN:MAX``: elastic membership through torch elastic's c10d rendezvous."""

import pytest
from launch_helpers import SCRIPTS

from accel_launch.config import AccelConfig
from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import build_launch_parser
from accel_launch.plan import build_plan
from accel_launch.runners.elastic import _launch_config

SCRIPT = str(SCRIPTS / "plain_worker.py")
RANGE = ("--cpu", "--num_machines", "2:3", "--main_process_ip", "10.0.0.1")


def plan_for(*flags, config=None):
    args = build_launch_parser().parse_args([*flags, SCRIPT])
    return build_plan(args, config, {"CUDA_VISIBLE_DEVICES": ""})


def test_a_range_runs_torch_elastic_with_min_and_max_nodes_over_c10d(tmp_path):
    plan = plan_for(*RANGE, "--num_processes", "6", "--max_restarts", "1", "--rdzv_conf", "a=1")
    assert (plan.min_machines, plan.num_machines, plan.min_nodes) == (2, 3, 2)
    assert (plan.mode, plan.nproc_per_node, plan.rdzv_backend) == ("elastic", 2, "c10d")
    assert plan.rdzv_endpoint == "10.0.0.1:29500" and plan.machine_rank == 0
    assert plan.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # a fresh store per round
    config = _launch_config(plan, str(tmp_path))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 3, 2)
    assert config.rdzv_configs["a"] == 1 and "rank" not in config.rdzv_configs  # not static
    fixed = plan_for("--cpu", "--num_machines", "3:3", "--main_process_ip", "h")
    assert fixed.min_machines is None and fixed.min_nodes == 3 and fixed.rdzv_backend == "static"


def test_the_config_file_holds_the_range_and_a_typed_count_replaces_it():
    config = AccelConfig.from_mapping(
        {"num_machines": 3, "min_num_machines": 1, "rdzv_backend": "static", "machine_rank": 1}
    )
    plan = plan_for("--cpu", "--main_process_ip", "h", config=config)
    assert (plan.min_machines, plan.num_machines, plan.rdzv_backend) == (1, 3, "c10d")
    assert plan.machine_rank == 0
    assert any("rdzv_backend static" in note for note in plan.notes)
    assert any("machine_rank 1" in note for note in plan.notes)
    typed = plan_for("--cpu", "--num_machines", "2", "--main_process_ip", "h", config=config)
    assert typed.min_machines is None and typed.num_machines == 2


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--rdzv_backend", "static"], "needs the c10d rendezvous"),
        (["--machine_rank", "1"], "--machine_rank 1 means nothing"),
        (["--num_processes", "4"], "at 3 machines"),
        (["--use_parallelism_config", "--parallelism_config_tp_size", "3"], "do not fit"),
    ],
)
def test_bad_elastic_combinations_are_explained(flags, match):
    with pytest.raises(LaunchArgumentError, match=match):
        plan_for(*RANGE, *flags)


def test_a_minimum_above_the_maximum_is_refused_from_file_and_flag(capsys):
    config = AccelConfig.from_mapping({"num_machines": 2, "min_num_machines": 3})
    with pytest.raises(LaunchArgumentError, match="--num_machines 2:3"):
        plan_for("--cpu", "--main_process_ip", "h", config=config)
    for text, why in (("3:2", "write 2:3"), ("0:2", "start at 1"), ("2-3", "MIN:MAX")):
        with pytest.raises(SystemExit):
            build_launch_parser().parse_args(["--num_machines", text, SCRIPT])
        assert why in capsys.readouterr().err


def test_help_documents_the_range():
    text = " ".join(build_launch_parser().format_help().split())
    assert "--num_machines N|MIN:MAX" in text and "last_call_timeout" in text
