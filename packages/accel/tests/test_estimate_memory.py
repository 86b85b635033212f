"""``accel estimate-memory``: counts checked by hand, the table, the errors, a cheap registration."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accel.commands.estimate import register

HERE = Path(__file__).resolve().parent


def run_estimate(capsys, monkeypatch, *argv):
    """Parse ``argv`` with a parser the entry point registered into; run the handler."""
    monkeypatch.chdir(HERE)
    parser = argparse.ArgumentParser(prog="accel")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["estimate-memory", *argv])
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_numbers_match_a_hand_computation(capsys, monkeypatch):
    code, out, _ = run_estimate(
        capsys,
        monkeypatch,
        "estimate_models:Small",
        "--model_kwargs",
        '{"hidden": 64}',
        "--json",
        "--dtypes",
        "float32",
        "bfloat16",
        "int8",
        "int4",
    )
    assert code == 0
    result = json.loads(out)
    n = 1000 * 64 + (64 * 10 + 10) + 2 * 64  # embedding + linear + layernorm = 64778
    assert result["parameters"] == n and result["buffers"] == 3
    assert (result["largest_layer_name"], result["largest_layer_parameters"]) == ("embed", 64000)
    rows = {row["dtype"]: row for row in result["rows"]}
    assert rows["float32"] == {
        "dtype": "float32",
        "largest_layer": 64000 * 4,
        "weights": n * 4,
        "gradients": n * 4,
        "adam": 2 * n * 4,
        "training": 4 * n * 4,
    }
    assert rows["bfloat16"]["weights"] == n * 2 and rows["bfloat16"]["training"] == 8 * n
    assert rows["int8"] == {
        "dtype": "int8",
        "largest_layer": 64000,
        "weights": n,
        "gradients": None,
        "adam": None,
        "training": None,
    }
    assert rows["int4"]["weights"] == n // 2 and rows["int4"]["largest_layer"] == 32000


def test_table_and_shared_weights(capsys, monkeypatch, tmp_path):
    code, out, _ = run_estimate(capsys, monkeypatch, "estimate_models:tied")
    assert code == 0
    assert "800 parameters; largest layer 0 (800 parameters)" in out  # the shared weight once
    lines = out.splitlines()
    assert (
        "| dtype   | Largest layer | Weights  | Gradients | Adam states | Training total |" in lines
    )
    assert (
        "| float32 | 3.12 KiB      | 3.12 KiB | 3.12 KiB  | 6.25 KiB    | 12.50 KiB      |" in lines
    )
    assert (
        "| int4    | 400 B         | 400 B    | -         | -           | -              |" in lines
    )
    assert [line.split("|")[1].strip() for line in lines if line.startswith("| ")][1:] == [
        "float32",
        "float16",
        "int8",
        "int4",
    ]  # Accelerate's default dtypes
    script = tmp_path / "my_models.py"
    script.write_text("from torch import nn\ndef build():\n    return nn.Linear(3, 2)\n")
    code, out, _ = run_estimate(capsys, monkeypatch, f"{script}:build", "--dtypes", "float16")
    assert code == 0 and "8 parameters" in out and "| float16 | 16 B" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bert-base-cased"], "is not module:callable. accel cannot download Hub models"),
        (["no_such_module_xyz:build"], "cannot import module 'no_such_module_xyz'"),
        (["estimate_models:Missing"], "has no 'Missing'"),
        (["estimate_models:not_a_model"], "returned int, not a torch.nn.Module"),
        (["estimate_models:Small", "--model_kwargs", "{hidden: 1}"], "is not JSON"),
        (["estimate_models:Small", "--model_kwargs", '{"depth": 1}'], "raised TypeError"),
        (["estimate_models:Small", "--library_name", "timm"], "does not download models"),
        (["estimate_models:Small", "--trust-remote-code"], "--trust_remote_code: accel"),
    ],
)
def test_errors_name_the_problem_and_exit_2(capsys, monkeypatch, argv, message):
    code, out, err = run_estimate(capsys, monkeypatch, *argv)
    assert code == 2 and out == ""
    assert message in err and err.startswith("accel estimate-memory: error:")


def test_accel_cli_runs_the_command_and_loads_it_only_when_it_runs():
    probe = (
        "import sys\n"
        "from accel_launch.cli import build_parser, main\n"
        "build_parser().parse_args(['estimate-memory', 'estimate_models:Small'])\n"
        "assert 'accel.commands.estimate' not in sys.modules, 'loaded before it runs'\n"
        "assert main(['estimate-memory', 'bert-base-cased']) == 2\n"
        "assert 'accel.commands.estimate' in sys.modules\n"
        "assert 'torch' not in sys.modules, 'registration imported torch'\n"
    )
    refused = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=HERE
    )
    assert refused.returncode == 0, refused.stderr
    assert "cannot download Hub models" in refused.stderr
    command = ["estimate-memory", "estimate_models:tied", "--dtypes", "bfloat16", "--json"]
    result = subprocess.run(
        [sys.executable, "-m", "accel_launch.cli", *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert estimate["parameters"] == 800 and estimate["rows"][0]["training"] == 4 * 800 * 2


# ----------------------------------------------------- Accelerate's names in accel.commands.estimate
def test_create_empty_model_builds_a_spec_on_meta_and_refuses_hub_names(monkeypatch):
    from accel.commands.estimate import create_empty_model
    from accel.commands.memory_spec import HubModelError

    monkeypatch.chdir(HERE)
    model = create_empty_model("estimate_models:Small", library_name=None)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 1000 * 64 + 64 * 10 + 10 + 2 * 64
    with pytest.raises(OSError, match="cannot download Hub models") as caught:
        create_empty_model("bert-base-cased", library_name="transformers")
    assert isinstance(caught.value, HubModelError)
    with pytest.raises(ValueError, match="library_name='keras'"):
        create_empty_model("estimate_models:Small", library_name="keras")


def test_create_empty_model_reads_a_local_transformers_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    from accel.commands.estimate import create_empty_model

    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
    )
    config.save_pretrained(tmp_path)
    model = create_empty_model(str(tmp_path), library_name=None)
    assert type(model).__name__ == "BertModel"
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_check_has_model_names_the_library_only_when_it_is_installed():
    import importlib.util

    from accel.commands.estimate import check_has_model

    has_transformers = importlib.util.find_spec("transformers") is not None
    missing_file = OSError("x does not appear to have a file named config.json")
    assert check_has_model(missing_file) == ("transformers" if has_transformers else "unknown")
    assert check_has_model(ValueError("something else")) == "unknown"
    has_timm = importlib.util.find_spec("timm") is not None
    assert check_has_model(RuntimeError("Unknown model (x)")) == ("timm" if has_timm else "unknown")


def test_estimate_training_usage_follows_accelerates_formula():
    from accel.commands.estimate import estimate_training_usage

    assert estimate_training_usage(1000, "float32") == {
        "model": 1000,
        "gradients": 1000,
        "optimizer": 2000,
        "step": 4000,
    }
    mixed = {"model": 1000, "gradients": 1500, "optimizer": 2000, "step": 2000}
    assert estimate_training_usage(1000, "bfloat16") == mixed
    assert estimate_training_usage(1000, "fp8") == mixed
    assert set(estimate_training_usage(1000, "fp8", msamp_config="O2").values()) == {-1}
    assert set(estimate_training_usage(1000, "int8").values()) == {-1}


def test_create_ascii_table_boxes_and_centres_the_cells():
    from accel.commands.estimate import create_ascii_table

    table = create_ascii_table(["dtype", "Size"], [["float32", "4 B"], ["int4", "0.5 B"]], "T")
    lines = table.splitlines()
    assert lines[0] == "┌" + "─" * 13 + "┐"
    assert lines[1] == "│" + "T".center(13) + "│"
    assert lines[3] == "│ dtype │" + "Size".center(5) + "│"
    assert lines[5] == "│float32│ 4 B │"
    assert lines[-1] == "└───────┴─────┘"
    assert len({len(line) for line in lines}) == 1
    wide = create_ascii_table(["a"], [["b"]], "a long title").splitlines()
    assert len({len(line) for line in wide}) == 1 and "a long title" in wide[1]


def test_main_runs_the_standalone_command(capsys, monkeypatch):
    from accel.commands.estimate import main

    monkeypatch.chdir(HERE)
    assert main(["estimate_models:tied", "--dtypes", "float32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 800
    assert main(["bert-base-cased"]) == 2
    assert "cannot download Hub models" in capsys.readouterr().err


def test_merge_module_has_accelerates_description():
    from accel.commands import merge

    assert merge.description == merge.DESCRIPTION
    assert merge.merge_command_parser().description == merge.description
