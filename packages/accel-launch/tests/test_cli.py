"""The ``accel`` command line: start-up without torch, config commands, errors, env and test."""

import json
import sys
from pathlib import Path

import pytest
from launch_helpers import SCRIPTS, accel_cmd, clean_env, run

from accel_launch.cli import main
from accel_launch.config import read_config_file

PROBE = """
import json, sys
from accel_launch.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print(json.dumps({"torch": "torch" in sys.modules, "code": code}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["launch", "--help"],
        ["config", "--help"],
        ["config", "default", "--config_file", "{tmp}/c.yaml"],
    ],
)
def test_fast_commands_do_not_import_torch(argv, tmp_path):
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    result = run([sys.executable, "-c", PROBE, *argv], timeout=60)
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe == {"torch": False, "code": 0}, result.stderr


def test_accel_launch_help_does_not_import_torch():
    code = "import sys; from accel_launch.cli import launch_main\ntry: launch_main(['--help'])\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    result = run([sys.executable, "-c", code], timeout=60)
    assert result.stdout.strip().endswith("False") and "--num_processes" in result.stdout


def test_console_scripts_are_installed():
    bin_dir = Path(sys.executable).parent
    for name in ("accel", "accel-launch"):
        result = run([str(bin_dir / name), "--help"], timeout=60)
        assert result.returncode == 0 and "usage:" in result.stdout


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 1
    assert "{launch,config,test,env" in capsys.readouterr().out


def test_config_default_writes_once(tmp_path, capsys):
    target = tmp_path / "c.yaml"
    assert (
        main(["config", "default", "--config_file", str(target), "--mixed_precision", "bf16"]) == 0
    )
    assert "saved at" in capsys.readouterr().out
    assert read_config_file(target).mixed_precision == "bf16"
    assert main(["config", "default", "--config_file", str(target)]) == 0
    assert "already exists" in capsys.readouterr().err
    assert read_config_file(target).mixed_precision == "bf16"


def test_config_default_uses_hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    assert main(["config", "default"]) == 0
    assert (tmp_path / "accel" / "default_config.yaml").is_file()


def test_interactive_config_with_piped_answers(tmp_path):
    target = tmp_path / "asked.yaml"
    answers = (
        "\n".join(
            [
                "1",  # multi-CPU
                "1",  # one machine
                "no",  # debug
                "yes",  # dynamo
                "INDUCTOR",
                "no",  # keep torch.compile defaults
                "4",  # processes
                "bf16",  # mixed precision
            ]
        )
        + "\n"
    )
    result = run(accel_cmd("config", "--config_file", str(target)), input=answers, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    config = read_config_file(target)
    assert (config.distributed_type, config.num_processes, config.use_cpu) == ("MULTI_CPU", 4, True)
    assert config.mixed_precision == "bf16" and config.dynamo_config.dynamo_backend == "INDUCTOR"
    assert "saved at" in result.stdout


def test_interactive_config_takes_defaults_at_end_of_input(tmp_path):
    target = tmp_path / "defaults.yaml"
    result = run(accel_cmd("config", "--config_file", str(target)), input="", timeout=60)
    assert result.returncode == 0, result.stderr
    config = read_config_file(target)
    assert (config.distributed_type, config.num_processes, config.mixed_precision) == (
        "NO",
        1,
        "no",
    )


def test_config_update_drops_ignored_keys(tmp_path, capsys):
    target = tmp_path / "old.yaml"
    target.write_text("num_processes: 2\nmystery: 1\ndynamo_backend: 'NO'\n")
    assert main(["config", "update", "--config_file", str(target)]) == 0
    assert "mystery" in capsys.readouterr().err
    assert "mystery" not in target.read_text() and "dynamo_config" in target.read_text()


def test_invalid_config_reports_file_key_value_and_exits_2(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("mixed_precision: fp32\n")
    result = run(
        accel_cmd("launch", "--config_file", str(config), str(SCRIPTS / "echo_module.py")),
        timeout=60,
    )
    assert result.returncode == 2
    assert str(config) in result.stderr and "mixed_precision='fp32'" in result.stderr
    assert "allowed: no, fp8, fp16, bf16" in result.stderr


def test_launch_argument_error_exits_2(tmp_path):
    result = run(
        accel_cmd(
            "launch",
            "--cpu",
            "--num_processes",
            "3",
            "--num_machines",
            "2",
            "--main_process_ip",
            "127.0.0.1",
            str(SCRIPTS / "echo_module.py"),
        ),
        timeout=60,
    )
    assert result.returncode == 2 and "not a multiple" in result.stderr


def test_accelerate_default_config_is_read_and_announced(tmp_path):
    theirs = tmp_path / "accelerate" / "default_config.yaml"
    theirs.parent.mkdir()
    theirs.write_text("use_cpu: true\nnum_processes: 1\nmixed_precision: fp16\nmystery_key: 1\n")
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(HF_HOME=str(tmp_path))
    env.pop("ACCEL_CONFIG_FILE", None)
    result = run(
        accel_cmd("launch", str(SCRIPTS / "echo_module.py"), str(out)), env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "using Accelerate's config" in result.stderr
    assert "'mystery_key'" in result.stderr
    assert (out / "module_rank0.json").is_file()


def test_env_report(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("num_processes: 2\nfsdp_config:\n  fsdp_version: 2\n")
    result = run(accel_cmd("env", "--config_file", str(config)), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Copy-and-paste the text below in a new issue")
    for needle in (
        "`accel-launch` version",
        "`accel-ckpt` version",
        "PyTorch version",
        "Platform",
        "System RAM",
        str(config),
        "\t- num_processes: 2",
        "\t\t- fsdp_version: 2",
    ):
        assert needle in result.stdout


def test_env_report_names_the_issue_tracker_from_the_package_metadata():
    from accel_launch.commands.env import issue_tracker

    urls = ["Homepage, https://example.org/accel", "Issues, https://example.org/accel/issues"]
    assert issue_tracker(urls) == "https://example.org/accel/issues"
    assert issue_tracker(["Bug Tracker, https://example.org/bugs"]) == "https://example.org/bugs"
    assert issue_tracker(["Homepage, https://example.org/accel"]) is None
    assert issue_tracker([]) is None


def test_accel_test_passes_on_two_cpu_processes(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 2\n")
    result = run(accel_cmd("test", "--config_file", str(config)), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Test is a success" in result.stdout
    assert "all checks passed on 2 process(es)" in result.stdout
    assert "main_process_first ordering ok" in result.stdout


def test_accel_test_single_process(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("use_cpu: true\nnum_processes: 1\n")
    result = run(accel_cmd("test", "--config_file", str(config)), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed on 1 process(es)" in result.stdout
