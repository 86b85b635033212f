"""Accelerate's launch-parser semantics accel keeps: switch defaults, helper namespaces, refusals."""

import argparse

import pytest
from launch_helpers import SCRIPTS

from accel_launch.commands.to_fsdp2 import to_fsdp2_command
from accel_launch.config import AccelConfig
from accel_launch.errors import ConfigFileNotFoundError, LaunchArgumentError
from accel_launch.launch_args import build_launch_parser, switch_names
from accel_launch.launch_helpers import (
    prepare_multi_gpu_env,
    resolve_launch_args,
    script_args_to_hyperparameters,
)
from accel_launch.plan import build_plan

SCRIPT = str(SCRIPTS / "plain_worker.py")
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def test_switches_default_to_false_and_a_config_still_fills_them():
    args = build_launch_parser().parse_args([SCRIPT])
    assert args.multi_gpu is False and args.cpu is False and args.debug is False
    assert {"cpu", "multi_gpu", "debug", "use_fsdp"} <= switch_names()
    # An unset switch is "not typed": the config file's value wins over the False default.
    plan = build_plan(args, AccelConfig(debug=True, use_cpu=True), NO_GPU)
    assert plan.contract.debug is True and plan.contract.use_cpu is True


def test_cpu_launch_sets_intel_openmp_variables_unless_already_set():
    parser = build_launch_parser()
    plan = build_plan(parser.parse_args(["--cpu", SCRIPT]), None, NO_GPU)
    assert plan.env["KMP_AFFINITY"] == "granularity=fine,compact,1,0"
    assert plan.env["KMP_BLOCKTIME"] == "1"
    kept = build_plan(parser.parse_args(["--cpu", SCRIPT]), None, {**NO_GPU, "KMP_BLOCKTIME": "0"})
    assert "KMP_BLOCKTIME" not in kept.env  # the launching environment's value is inherited
    plain = build_plan(parser.parse_args([SCRIPT]), None, NO_GPU)
    assert "KMP_AFFINITY" not in plain.env


def test_resolve_launch_args_fills_untyped_flags_from_the_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\ndebug: true\n"
        "num_processes: 3\nmixed_precision: bf16\n"
    )
    parser = build_launch_parser()
    args = parser.parse_args(["--config_file", str(config), "--num_processes", "2", SCRIPT])
    args, file_config, mp_from_config = resolve_launch_args(args)
    assert file_config is not None and mp_from_config is True
    assert (args.num_processes, args.debug, args.mixed_precision) == (2, True, "bf16")
    assert args.num_machines == 1 and args.gpu_ids == "all"


def test_prepare_multi_gpu_env_takes_a_namespace_built_by_hand():
    args = argparse.Namespace(num_processes=1, main_process_port=0, mixed_precision="no")
    env = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"  # 0 asks for a free port
    assert env["MASTER_PORT"] == args.master_port


def test_megatron_flags_parse_and_are_refused_with_the_alternatives():
    args = build_launch_parser().parse_args(
        ["--use_megatron_lm", "--megatron_lm_tp_degree", "2", SCRIPT]
    )
    with pytest.raises(LaunchArgumentError, match=r"--megatron_lm_tp_degree: Megatron-LM is not"):
        build_plan(args, None, NO_GPU)
    # Without --use_megatron_lm the settings act on nothing, as in Accelerate.
    quiet = build_launch_parser().parse_args(["--megatron_lm_tp_degree", "2", "--cpu", SCRIPT])
    assert build_plan(quiet, None, NO_GPU).num_processes == 1


def test_script_args_become_typed_hyperparameters():
    converted = script_args_to_hyperparameters(
        ["--name", "bert", "--do-train", "False", "--epochs", "3", "--lr=5e-5", "--x", "-1.5"]
    )
    assert converted == {"name": "bert", "do_train": False, "epochs": 3, "lr": 5e-5, "x": -1.5}
    with pytest.raises(ValueError, match=r"'--do_train' has no value"):
        script_args_to_hyperparameters(["--do_train", "--epochs", "3"])


def test_to_fsdp2_missing_config_is_a_file_not_found_error(tmp_path):
    args = argparse.Namespace(config_file=str(tmp_path / "none.yaml"), output_file=None)
    args.overwrite = True
    with pytest.raises(FileNotFoundError, match=r"--config_file=.*none.yaml.*does not exist"):
        to_fsdp2_command(args)
    with pytest.raises(ConfigFileNotFoundError):
        to_fsdp2_command(args)
