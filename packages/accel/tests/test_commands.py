"""Accelerate's CLI module paths (``accel.commands.*``): names, parsers, the commands they run."""

import argparse
import importlib
import io
import json
import os
import subprocess
import sys

import pytest
import yaml

from accel.commands import test as cli_test
from accel.commands.accelerate_cli import main
from accel.commands.config import get_config_parser, load_config_from_file
from accel.commands.config.config_args import ClusterConfig, SageMakerConfig
from accel.commands.env import env_command_parser
from accel.commands.launch import (
    clean_option,
    launch_command_parser,
    sagemaker_launcher,
    tpu_pod_launcher,
)
from accel.commands.menu import BulletMenu
from accel.commands.menu import input as menu_input
from accel.commands.menu.keymap import KEYMAP
from accel.commands.to_fsdp2 import (
    ARGUMENT_KEY_MAPPING,
    ConversionStatus,
    convert_config_to_fsdp2,
    load_config,
    to_fsdp2_command_parser,
)
from accel.commands.tpu import tpu_command_parser
from accel.commands.utils import CustomArgumentParser
from accel.utils import DistributedType
from accel_launch.errors import ConfigError, LaunchArgumentError

# Accelerate 1.15's public names of each module path (its own helpers' names, not re-imports).
NAMES = {
    "accelerate_cli": ["main"],
    "config": ["default_config_file", "get_config_parser", "load_config_from_file", "main"],
    "config.cluster": [
        "DEEPSPEED_MULTINODE_LAUNCHERS",
        "DYNAMO_BACKENDS",
        "FSDP2_STATE_DICT_TYPE",
        "FSDP_AUTO_WRAP_POLICY",
        "FSDP_BACKWARD_PREFETCH",
        "FSDP_SHARDING_STRATEGY",
        "FSDP_STATE_DICT_TYPE",
        "TORCH_DYNAMO_MODES",
        "get_cluster_input",
    ],
    "config.config": [
        "cache_dir",
        "config_command",
        "config_command_parser",
        "default_config_file",
        "default_yaml_config_file",
        "description",
        "get_user_input",
        "main",
    ],
    "config.config_args": [
        "BaseConfig",
        "ClusterConfig",
        "SageMakerConfig",
        "cache_dir",
        "default_config_file",
        "default_json_config_file",
        "default_yaml_config_file",
        "hf_cache_home",
        "load_config_from_file",
    ],
    "config.config_utils": ["DYNAMO_BACKENDS", "SubcommandHelpFormatter"],
    "config.default": [
        "default_command_parser",
        "default_config_command",
        "default_json_config_file",
        "description",
        "write_basic_config",
    ],
    "config.sagemaker": [
        "DYNAMO_BACKENDS",
        "SAGEMAKER_PARALLEL_EC2_INSTANCES",
        "TORCH_DYNAMO_MODES",
        "get_sagemaker_input",
    ],
    "config.update": [
        "default_config_file",
        "description",
        "update_command_parser",
        "update_config",
        "update_config_command",
    ],
    "env": ["default_config_file", "env_command", "env_command_parser", "main", "version"],
    "launch": [
        "CustomHelpFormatter",
        "DEEPSPEED_MULTINODE_LAUNCHERS",
        "DYNAMO_BACKENDS",
        "TORCH_DYNAMO_MODES",
        "clean_option",
        "default_config_file",
        "deepspeed_launcher",
        "launch_command",
        "launch_command_parser",
        "logger",
        "main",
        "multi_gpu_launcher",
        "options_to_group",
        "sagemaker_launcher",
        "simple_launcher",
        "tpu_launcher",
        "tpu_pod_launcher",
    ],
    "menu": ["BulletMenu"],
    "menu.cursor": ["hide", "hide_cursor", "show_cursor"],
    "menu.helpers": [
        "CURSOR_TO_CHAR",
        "TERMINAL_WIDTH",
        "Direction",
        "clear_line",
        "forceWrite",
        "linebreak",
        "move_cursor",
        "reset_cursor",
        "writeColor",
    ],
    "menu.input": ["KEYMAP", "KeyHandler", "mark", "mark_multiple", "register"],
    "menu.keymap": ["ARROW_KEY_FLAG", "KEYMAP", "get_character", "get_raw_chars"],
    "menu.selection_menu": ["KEYMAP", "BulletMenu", "in_colab"],
    "test": ["main", "test_command", "test_command_parser"],
    "to_fsdp2": [
        "ARGUMENT_KEY_MAPPING",
        "ARGUMENT_VALUE_MAPPING",
        "ConversionStatus",
        "convert_config_to_fsdp2",
        "load_config",
        "logger",
        "to_fsdp2_command",
        "to_fsdp2_command_parser",
    ],
    "tpu": ["default_config_file", "main", "tpu_command_launcher", "tpu_command_parser"],
    "utils": ["CustomArgumentGroup", "CustomArgumentParser"],
}

CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def test_every_commands_module_imports_with_accelerates_names():
    for module, names in NAMES.items():
        imported = importlib.import_module(f"accel.commands.{module}")
        assert [name for name in names if not hasattr(imported, name)] == [], module


def test_parsers_parse_accelerates_command_lines_standalone_and_as_subcommands():
    args = launch_command_parser().parse_args(
        ["--num_processes", "2", "--mixed-precision", "bf16", "train.py", "--lr", "0.1"]
    )
    assert (args.num_processes, args.mixed_precision) == (2, "bf16")
    assert (args.training_script, args.training_script_args) == ("train.py", ["--lr", "0.1"])
    assert not hasattr(args, "func")  # standalone: Accelerate sets func on subcommands only

    assert (
        cli_test.test_command_parser().parse_args(["--config_file", "c.yaml"]).config_file
        == "c.yaml"
    )
    assert env_command_parser().parse_args([]).config_file is None
    tpu = tpu_command_parser().parse_args(
        ["--tpu_name", "t", "--tpu-zone", "z", "--command", "a", "--command", "b", "--debug"]
    )
    assert (tpu.tpu_name, tpu.tpu_zone, tpu.command, tpu.debug) == ("t", "z", ["a", "b"], True)
    fsdp2 = to_fsdp2_command_parser().parse_args(["--config-file", "in.yaml", "--overwrite"])
    assert (fsdp2.config_file, fsdp2.overwrite, fsdp2.output_file) == ("in.yaml", True, None)
    default = get_config_parser().parse_args(["default", "--mixed_precision", "fp16"])
    assert (default.subcommand, default.mixed_precision) == ("default", "fp16")
    assert default.func.__name__ == "default_config_command"

    subparsers = argparse.ArgumentParser().add_subparsers()
    for build, name in [
        (launch_command_parser, "launch_command"),
        (cli_test.test_command_parser, "test_command"),
        (env_command_parser, "env_command"),
        (tpu_command_parser, "tpu_command_launcher"),
        (to_fsdp2_command_parser, "to_fsdp2_command"),
    ]:
        assert build(subparsers).get_default("func").__name__ == name
    assert clean_option("--num-processes") == "num_processes"


def test_custom_argument_parser_takes_both_spellings_in_subcommands_too():
    parser = CustomArgumentParser(prog="tool")
    group = parser.add_argument_group("Resources")
    group.add_argument("--num_processes", type=int)
    sub = parser.add_subparsers(dest="cmd").add_parser("run")
    sub.add_argument("--main_process_port", type=int)
    args = parser.parse_args(["--num-processes", "2", "run", "--main-process-port", "29500"])
    assert (args.num_processes, args.main_process_port) == (2, 29500)
    assert isinstance(sub, CustomArgumentParser)


def test_cli_config_env_to_fsdp2_and_tpu_config_through_main(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    main(["config", "default", "--config_file", str(config), "--mixed_precision", "bf16"])
    assert yaml.safe_load(config.read_text())["mixed_precision"] == "bf16"
    main(["config", "update", "--config-file", str(config)])
    assert f"updated at {config}" in capsys.readouterr().out

    main(["env", "--config_file", str(config)])
    assert "`accel-launch` version" in capsys.readouterr().out

    fsdp1 = tmp_path / "fsdp1.yaml"
    fsdp1.write_text(
        yaml.safe_dump(
            {
                "distributed_type": "FSDP",
                "fsdp_config": {
                    "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                    "fsdp_offload_params": True,
                },
            }
        )
    )
    main(["to-fsdp2", "--config_file", str(fsdp1), "--output_file", str(tmp_path / "fsdp2.yaml")])
    converted = yaml.safe_load((tmp_path / "fsdp2.yaml").read_text())["fsdp_config"]
    assert converted == {
        "fsdp_reshard_after_forward": False,
        "fsdp_offload_params": True,
        "fsdp_version": 2,
    }
    with pytest.raises(SystemExit) as refused:  # exists, no --overwrite: a clear error, code 2
        main(
            ["to-fsdp2", "--config_file", str(fsdp1), "--output_file", str(tmp_path / "fsdp2.yaml")]
        )
    assert refused.value.code == 2 and "--overwrite" in capsys.readouterr().err

    main(["tpu-config", "--tpu_name", "pod", "--tpu_zone", "eu-a", "--command", "ls", "--debug"])
    printed = capsys.readouterr().out
    assert "gcloud compute tpus tpu-vm ssh pod --zone eu-a" in printed and "--worker all" in printed
    with pytest.raises(SystemExit) as no_tpu:
        main(["tpu-config", "--command", "ls", "--debug", "--config_file", str(config)])
    assert no_tpu.value.code == 2 and "--tpu_name" in capsys.readouterr().err

    with pytest.raises(SystemExit) as bare:
        main([])
    assert bare.value.code == 1 and "to-fsdp2" in capsys.readouterr().out


@pytest.mark.timeout(400)
def test_cli_launch_and_test_run_jobs_in_a_subprocess(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[1]) / f\"rank{os.environ['RANK']}\"\n"
        "out.write_text(os.environ['WORLD_SIZE'])\n"
    )
    cli = [sys.executable, "-m", "accel.commands.accelerate_cli"]
    launched = subprocess.run(
        [*cli, "launch", "--cpu", "--num-processes", "2", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env=CPU_ENV,
    )
    assert launched.returncode == 0, launched.stderr
    assert {p.name: p.read_text() for p in tmp_path.glob("rank*")} == {"rank0": "2", "rank1": "2"}

    config = tmp_path / "one.yaml"
    config.write_text("use_cpu: true\nnum_processes: 1\n")
    tested = subprocess.run(
        [*cli, "test", "--config_file", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
        env=CPU_ENV,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "all checks passed on 1 process(es)" in tested.stdout
    assert "Test is a success" in tested.stdout


@pytest.mark.timeout(200)
def test_a_failing_job_ends_main_with_its_exit_code(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(SystemExit) as stop:
        main(["launch", "--cpu", "--num_processes", "1", str(script)])
    assert stop.value.code == 3


def test_config_files_as_accelerates_dataclasses(tmp_path):
    source = tmp_path / "c.yaml"
    source.write_text(
        "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 4\nmixed_precision: BF16\n"
        "fsdp_config: {}\ncollective_timeout: 60\n"
    )
    config = load_config_from_file(str(source))
    assert isinstance(config, ClusterConfig)
    assert config.distributed_type is DistributedType.MULTI_CPU
    assert (config.num_processes, config.mixed_precision, config.debug) == (4, "bf16", False)
    assert config.to_dict()["compute_environment"] == "LOCAL_MACHINE"
    # Empty sections are left out, as Accelerate's to_dict does (`transformers env` prints it).
    assert not {"fsdp_config", "deepspeed_config", "dynamo_config"} & set(config.to_dict())
    config.dynamo_config = {"dynamo_backend": DistributedType.NO, "dynamo_options": {}}
    assert config.to_dict()["dynamo_config"] == {"dynamo_backend": "NO", "dynamo_options": None}
    config.dynamo_config = {}

    config.to_json_file(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["num_processes"] == 4
    assert ClusterConfig.from_json_file(str(tmp_path / "c.json")) == config
    config.to_yaml_file(tmp_path / "again.yaml")
    assert ClusterConfig.from_yaml_file(str(tmp_path / "again.yaml")) == config

    with pytest.raises(FileNotFoundError, match=r"missing\.yaml"):
        load_config_from_file(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_processes: 0\n")
    with pytest.raises(ConfigError, match="num_processes"):
        load_config_from_file(str(bad))


def test_sagemaker_and_tpu_pods_are_refused_with_the_reason(tmp_path):
    sagemaker = tmp_path / "sm.yaml"
    sagemaker.write_text("compute_environment: AMAZON_SAGEMAKER\n")
    with pytest.raises(LaunchArgumentError, match="SageMaker launches are not supported"):
        load_config_from_file(str(sagemaker))
    with pytest.raises(LaunchArgumentError, match="SageMaker"):
        SageMakerConfig("AMAZON_SAGEMAKER", "NO", "no", False, False, "ml.p3.2xlarge", "role")
    from accel.commands.config.sagemaker import get_sagemaker_input

    with pytest.raises(LaunchArgumentError, match="LOCAL_MACHINE"):
        get_sagemaker_input()
    args = launch_command_parser().parse_args(["train.py"])
    with pytest.raises(LaunchArgumentError, match="SageMaker"):
        sagemaker_launcher(None, args)
    with pytest.raises(LaunchArgumentError, match="accel tpu-config"):
        tpu_pod_launcher(args)


def test_to_fsdp2_tables_and_loading(tmp_path):
    assert ARGUMENT_KEY_MAPPING["fsdp_sharding_strategy"] == "fsdp_reshard_after_forward"
    assert ARGUMENT_KEY_MAPPING["fsdp_use_orig_params"] is ConversionStatus.REMOVED
    config = {
        "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_sync_module_states": True}
    }
    assert convert_config_to_fsdp2(config)["fsdp_config"] == {
        "fsdp_reshard_after_forward": True,
        "fsdp_version": 2,
    }
    (tmp_path / "c.yaml").write_text("fsdp_config:\n  fsdp_version: 2\n")
    assert load_config(str(tmp_path / "c.yaml")) == {"fsdp_config": {"fsdp_version": 2}}
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(tmp_path / "list.yaml"))


def test_bullet_menu_asks_for_a_number_without_a_terminal(monkeypatch, capsys):
    menu = BulletMenu("Which backend?", ["gloo", "nccl", "mpi"])
    monkeypatch.setattr(sys, "stdin", io.StringIO("7\nnccl\n2\n"))
    assert menu.run(default_choice=0) == 2
    out = capsys.readouterr().out
    assert "Which backend?" in out and "  1. nccl" in out and "'7' is not a choice" in out
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert menu.run(default_choice=1) == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # end of input: the default
    assert menu.run(default_choice=2) == 2
    with pytest.raises(ValueError, match="default_choice=3"):
        menu.run(default_choice=3)


def test_bullet_menu_moves_with_keys_and_selects_with_enter(monkeypatch, capsys):
    presses = iter([chr(KEYMAP["down"]), chr(KEYMAP["down"]), chr(KEYMAP["up"]), "2", "\r"])
    monkeypatch.setattr(menu_input, "get_character", lambda: next(presses))
    menu = BulletMenu("Pick", ["a", "b", "c"])
    assert menu._run_keys(0) == 2  # down, down, up -> 1; the digit 2 jumps to row 2
    assert capsys.readouterr().out.endswith("\rc\n\x1b[?25h")  # the choice, cursor shown
