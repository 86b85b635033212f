"""Accelerate's environment helpers of ``accelerate.utils.launch``, read back by the workers' side."""

import argparse
import os

import pytest

from accel_launch.launch_args import build_launch_parser
from accel_launch.launch_helpers import (
    _convert_nargs_to_dict,
    env_var_path_add,
    filter_args,
    prepare_extend_env_parallelism_config,
    setup_fp8_env,
)
from accel_state.contract import LaunchContract, read_parallelism_settings


def test_filter_args_keeps_only_what_the_target_parser_defines():
    target = argparse.ArgumentParser()
    target.add_argument("--nproc_per_node", default="1")
    target.add_argument("--master_port", default=None)
    target.add_argument("--rdzv_backend", default="static")
    launcher_args = argparse.Namespace(
        nproc_per_node="4", master_port="29501", mixed_precision="bf16"
    )
    filtered = filter_args(launcher_args, target, ["--rdzv_backend", "c10d"])
    assert vars(filtered) == {"nproc_per_node": "4", "master_port": "29501", "rdzv_backend": "c10d"}
    assert not hasattr(filtered, "mixed_precision")
    assert filter_args(argparse.Namespace(), target).rdzv_backend == "static"


def test_env_var_path_add_appends_without_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCEL_TEST_PATH", os.pathsep.join(["/a", "", "/b"]))
    assert env_var_path_add("ACCEL_TEST_PATH", tmp_path) == os.pathsep.join(
        ["/a", "/b", str(tmp_path)]
    )
    assert os.environ["ACCEL_TEST_PATH"] == os.pathsep.join(["/a", "", "/b"])
    monkeypatch.delenv("ACCEL_TEST_PATH")
    assert env_var_path_add("ACCEL_TEST_PATH", "/c") == "/c"


def test_setup_fp8_env_is_read_back_as_the_fp8_recipe():
    args = build_launch_parser().parse_args(
        [
            "--mixed_precision", "fp8", "--fp8_backend", "te", "--fp8_margin", "2",
            "--fp8_format", "hybrid", "--fp8_override_linear_precision", "false,false,true",
            "script.py",
        ]
    )  # fmt: skip
    env = setup_fp8_env(args, {"KEEP": "1"})
    assert env["KEEP"] == "1"
    assert env["ACCELERATE_FP8_BACKEND"] == "TE"
    assert env["ACCELERATE_FP8_MARGIN"] == "2"
    assert "ACCELERATE_FP8_INTERVAL" not in env  # not given
    contract = LaunchContract.from_env(env)
    assert contract.fp8_backend == "TE"
    assert contract.fp8_config["margin"] == 2
    assert contract.fp8_config["fp8_format"] == "HYBRID"
    assert contract.fp8_config["override_linear_precision"] == [False, False, True]
    with pytest.raises(ValueError, match="fp8_override_linear_precision"):
        setup_fp8_env(argparse.Namespace(fp8_override_linear_precision="true,false"), {})


def test_parallelism_config_env_is_read_back_by_the_workers():
    parser = build_launch_parser()
    args = parser.parse_args(
        [
            "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2",
            "--parallelism_config_cp_comm_strategy", "alltoall", "script.py",
        ]
    )  # fmt: skip
    env = prepare_extend_env_parallelism_config(args, {})
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    # cp_size is 1 (unset): the ring strategy is not handed over, as in Accelerate.
    assert read_parallelism_settings(env) == {"dp_shard_size": "2", "tp_size": "2"}
    assert LaunchContract.from_env(env).use_parallelism_config is True
    with_cp = parser.parse_args(
        [
            "--parallelism_config_cp_size",
            "2",
            "--parallelism_config_cp_comm_strategy",
            "alltoall",
            "s.py",
        ]
    )
    assert read_parallelism_settings(prepare_extend_env_parallelism_config(with_cp, {})) == {
        "cp_size": "2",
        "cp_comm_strategy": "alltoall",
    }


def test_convert_nargs_to_dict_takes_accelerates_parameter_name():
    assert _convert_nargs_to_dict(nargs=["--lr", "5e-5", "--epochs", "3", "--fast", "True"]) == {
        "lr": 5e-5,
        "epochs": 3,
        "fast": True,
    }
    with pytest.raises(ValueError, match="store_true"):
        _convert_nargs_to_dict(["--do_train"])
