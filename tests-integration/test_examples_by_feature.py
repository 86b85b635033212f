"""Every script of examples/by_feature, launched as its docstring says, judged by what it prints.

One launch per example (two for checkpoint and resume), each checked for the result it claims:
accuracies above a threshold, the resumed step equal to the saved one, equal weights, the files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import EXAMPLES, launch

BY_FEATURE = EXAMPLES / "by_feature"

pytestmark = pytest.mark.timeout(600)


def run_example(
    name: str, *args: str, env: dict[str, str], flags: tuple[str, ...] = (), processes: int = 2
) -> str:
    """Launch ``examples/by_feature/<name>.py`` on CPU processes; return its stdout."""
    result = launch(
        BY_FEATURE / f"{name}.py", *args, env=env, processes=processes, flags=flags, timeout=400
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def number(pattern: str, text: str) -> float:
    """The number that ``pattern``'s group captures in ``text`` (the last match)."""
    found = re.findall(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found[-1])


def test_checkpointing_resumes_at_the_saved_step(clean_env, tmp_path):
    first = run_example(
        "checkpointing",
        "--checkpointing_steps", "5", "--stop_after_step", "12", "--output_dir", str(tmp_path),
        env=clean_env,
    )  # fmt: skip
    assert re.findall(r"saved step (\d+)", first) == ["5", "10"]
    assert "stopping at step 12" in first
    resumed = run_example(
        "checkpointing",
        "--checkpointing_steps", "5", "--resume_from_checkpoint", "latest",
        "--output_dir", str(tmp_path),
        env=clean_env,
    )  # fmt: skip
    assert number(r"resumed at step (\d+)", resumed) == 10  # the newest checkpoint's step
    done, total = re.findall(r"final step (\d+) of (\d+)", resumed)[0]
    assert done == total  # the resumed run took exactly the steps left
    assert number(r"final accuracy ([\d.]+)", resumed) > 0.85
    # total_limit=3 keeps the newest three of the checkpoints written.
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3


def test_tracking_writes_each_epoch_once(clean_env, tmp_path):
    output = run_example(
        "tracking", "--report_to", "jsonl", "csv", "--project_dir", str(tmp_path), env=clean_env
    )
    assert "logged 4 epochs to jsonl, csv" in output
    run = tmp_path / "breast_cancer"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [record["epoch"] for record in records] == [0, 1, 2, 3]  # main process only
    assert records[-1]["accuracy"] > 0.9 and records[-1]["train_loss"] < records[0]["train_loss"]
    assert json.loads((run / "config.json").read_text())["processes"] == 2
    assert (run / "metrics.csv").read_text().count("accuracy") == 4


def test_gradient_accumulation_equals_the_large_batch(clean_env):
    output = run_example("gradient_accumulation", env=clean_env)
    accumulated = number(r"x 4 accumulation: (\d+) optimizer steps", output)
    assert accumulated == number(r"batches of 32: (\d+) optimizer steps", output) == 3
    assert number(r"max weight difference ([\d.e+-]+)", output) < 1e-6


def test_automatic_gradient_accumulation_keeps_the_effective_batch(clean_env):
    output = run_example(
        "automatic_gradient_accumulation", "--batch_size", "128", "--memory_limit", "100",
        env=clean_env,
    )  # fmt: skip
    micro = number(r"micro-batch (\d+) x", output)
    steps = number(r"x (\d+) accumulation steps", output)
    assert micro <= 100 and steps > 1 and micro * steps == 128
    assert "effective batch 128 (asked for 128)" in output


def test_memory_halves_the_batch_until_it_fits(clean_env):
    output = run_example("memory", "--memory_limit", "100", env=clean_env)
    assert "tried batch sizes [512, 256, 128, 64]" in output
    assert number(r"final loss ([\d.]+)", output) < 0.5


def test_early_stopping_stops_every_process_at_the_same_epoch(clean_env):
    output = run_example("early_stopping", env=clean_env)
    stops = dict(re.findall(r"process (\d) stops after epoch (\d+)", output))
    assert set(stops) == {"0", "1"} and stops["0"] == stops["1"]
    assert int(stops["0"]) < 49  # well before --max_epochs


def test_cross_validation_scores_every_fold(clean_env):
    output = run_example("cross_validation", "--num_folds", "3", env=clean_env)
    held_out = [int(count) for count in re.findall(r"on (\d+) samples", output)]
    assert len(held_out) == 3 and sum(held_out) == 1437  # the folds partition the 80% split
    assert number(r"mean cross-validation accuracy ([\d.]+)", output) > 0.9
    assert number(r"test set: accuracy ([\d.]+)", output) > 0.9


def test_multi_process_metrics_equal_the_single_process_metric(clean_env):
    output = run_example("multi_process_metrics", env=clean_env)
    assert "gathered 50 predictions for 50 samples" in output
    assert re.findall(r"process \d evaluated (\d+) samples", output) == ["32", "32"]  # padded
    gathered, single = re.findall(r"macro F1 ([\d.]+) gathered, ([\d.]+) on one process", output)[0]
    assert gathered == single and float(gathered) > 0.9


def test_local_sgd_averages_diverging_models(clean_env):
    output = run_example("local_sgd", "--local_sgd_steps", "8", env=clean_env)
    assert number(r"differed by up to ([\d.e+-]+)", output) > 1e-4
    assert number(r"difference after the block ([\d.e+-]+)", output) == 0.0
    assert number(r"test accuracy ([\d.]+)", output) > 0.85


def test_profiler_writes_a_trace_per_process(clean_env, tmp_path):
    output = run_example("profiler", "--trace_dir", str(tmp_path), env=clean_env)
    assert "Self CPU time total" in output and "aten::" in output
    for rank in (0, 1):
        trace = json.loads((tmp_path / f"profile_{rank}.json").read_text())
        assert trace["traceEvents"]


def test_fsdp_shards_the_parameters_and_tracks_memory(clean_env):
    output = run_example("fsdp_with_peak_mem_tracking", env=clean_env)
    held = re.findall(r"process (\d) holds (\d+) of (\d+) parameters", output)
    assert len(held) == 2
    total = int(held[0][2])
    assert sum(int(count) for _, count, _ in held) == total  # halves that add up to the model
    assert all(int(count) < total for _, count, _ in held)
    assert len(re.findall(r"epoch \d: memory at start \d+ MB, peak \d+ MB", output)) == 2
    assert f"gathered state dict: {total} parameters" in output
    assert number(r"test accuracy ([\d.]+)", output) > 0.85


def test_deepspeed_fills_the_config_file(clean_env):
    config = BY_FEATURE / "deepspeed_config.json"
    flags = (
        "--use_deepspeed", "--deepspeed_config_file", str(config),
        "--gradient_accumulation_steps", "2", "--gradient_clipping", "1.0",
    )  # fmt: skip
    output = run_example("deepspeed_with_config_support", env=clean_env, flags=flags)
    assert (
        "engine config: zero stage 2, micro-batch 16, accumulation 2, train batch 64, clipping 1.0"
        in output
    )
    assert number(r"epoch 2: test accuracy ([\d.]+)", output) > 0.85


def test_deepspeed_multiple_plugins_distils_a_zero3_teacher_into_a_zero2_student(clean_env):
    output = run_example("deepspeed_multiple_plugins", env=clean_env)
    losses = [float(value) for value in re.findall(r"step \d+: loss ([\d.]+)", output)]
    assert len(losses) == 2, output
    assert losses[-1] < losses[0], output  # the student moved towards the teacher


def test_deepspeed_multiple_models_train_and_resume_under_two_accelerators(clean_env, tmp_path):
    first = run_example("deepspeed_multiple_models", "--output_dir", str(tmp_path), env=clean_env)
    assert "engines: zero stages 2 3" in first
    final = re.findall(r"epoch 1: accuracy zero2 ([\d.]+) zero3 ([\d.]+)", first)
    assert final and min(float(value) for value in final[0]) > 0.85, first
    for name in ("zero2", "zero3"):
        assert (tmp_path / name / "deepspeed" / "engine").is_dir()
    resumed = run_example(
        "deepspeed_multiple_models", "--output_dir", str(tmp_path), "--resume", env=clean_env
    )
    # Both engines loaded their state: the same evaluation as at the end of training.
    assert re.findall(r"resumed: accuracy zero2 ([\d.]+) zero3 ([\d.]+)", resumed) == final


def test_big_model_inference_offloads_and_matches(clean_env):
    result = subprocess.run(
        [sys.executable, str(BY_FEATURE / "big_model_inference.py"), "--cpu_budget", "8MB"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    on_cpu = number(r"(\d+) modules on the CPU", result.stdout)
    on_disk = number(r"(\d+) offloaded to disk", result.stdout)
    assert on_cpu > 0 and on_disk > 0
    assert number(r"outputs: ([\d.e+-]+)", result.stdout) < 1e-6


def test_nd_parallel_trains_on_a_mesh_and_resumes_on_another(clean_env, tmp_path):
    """dp_shard 2 x tp 2 from the script's arguments for one epoch, then a fresh launch on HSDP
    (dp_replicate 2 x dp_shard 2 from the launcher's flags) resumes its checkpoint."""
    project = str(tmp_path / "nd")
    first = run_example(
        "nd_parallel", "--dp_shard_size", "2", "--tp_size", "2", "--epochs", "1",
        "--project_dir", project, env=clean_env, processes=4,
    )  # fmt: skip
    assert "mesh DeviceMesh((dp_shard=2, tp=2)" in first and "2 data-parallel ranks" in first
    after_one = number(r"epoch 0: test loss ([\d.]+)", first)
    assert after_one < 2.0  # ln(64) = 4.16 for a model that learned nothing
    flags = (
        "--parallelism_config_dp_replicate_size",
        "2",
        "--parallelism_config_dp_shard_size",
        "2",
    )
    resumed = run_example(
        "nd_parallel", "--epochs", "2", "--resume", "--project_dir", project,
        env=clean_env, flags=flags, processes=4,
    )  # fmt: skip
    assert "mesh DeviceMesh((dp_replicate=2, dp_shard=2)" in resumed
    assert "epoch 0" not in resumed  # resumed after the saved epoch
    assert number(r"epoch 1: test loss ([\d.]+)", resumed) < after_one


def test_launch_helpers_start_a_job_from_python(clean_env):
    """Started with plain ``python``: the script launches its own ranks (PrepareForLaunch)."""
    result = subprocess.run(
        [sys.executable, str(BY_FEATURE / "launch_helpers.py"), "--num_processes", "2"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=400,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "2 processes, mixed precision bf16" in result.stdout
    assert number(r"accuracy ([\d.]+)", result.stdout) > 0.9
    assert "same weights: True" in result.stdout
