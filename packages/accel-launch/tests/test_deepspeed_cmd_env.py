"""``prepare_deepspeed_cmd_env``: the command and environment it gives start a 2-process job."""

import json

import pytest
from launch_helpers import SCRIPTS, clean_env, run

from accel_launch.launch_args import build_launch_parser
from accel_launch.launch_helpers import launch_flags_of, prepare_deepspeed_cmd_env

WORKER = str(SCRIPTS / "deepspeed_env_worker.py")


@pytest.mark.timeout(240)
def test_prepare_deepspeed_cmd_env_starts_two_deepspeed_workers(tmp_path, monkeypatch):
    for key, value in clean_env().items():
        monkeypatch.setenv(key, value)
    flags = ["--cpu", "--num_processes", "2", "--zero_stage", "2", WORKER, str(tmp_path)]
    args = build_launch_parser().parse_args(flags)
    command, env = prepare_deepspeed_cmd_env(args)
    assert args.use_deepspeed is True  # set for the caller, as Accelerate does
    assert command[-2:] == [WORKER, str(tmp_path)]
    # Regression: the DeepSpeed flags were dropped from the command (ZeRO stage lost).
    assert {"--use_deepspeed", "--num_processes=2", "--cpu", "--zero_stage=2"} <= set(command)
    assert env["ACCEL_USE_DEEPSPEED"] == "true"
    result = run(command, timeout=200, env=env)
    assert result.returncode == 0, result.stderr
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, record in enumerate(records):
        assert (record["rank"], record["world_size"]) == (rank, 2)
        assert record["use_deepspeed"] == "true" and record["use_cpu"] == "true"
        assert 2 in (record["deepspeed_config"] or {}).values(), record


def test_launch_flags_of_parse_back_to_the_same_arguments():
    flags = ["--cpu", "--num_processes", "2", "--mixed_precision", "bf16", "--env", "A=1"]
    flags += ["--env", "B=2", "--use_deepspeed", "--zero3_init_flag", "false", "-m", "pkg.mod", "x"]
    parser = build_launch_parser()
    args = parser.parse_args(flags)
    again = parser.parse_args([*launch_flags_of(args), "pkg.mod", "x"])
    assert vars(again) == vars(args)
    assert launch_flags_of(parser.parse_args(["script.py"])) == []  # defaults give no flags
