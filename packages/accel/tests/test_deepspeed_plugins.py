"""Several DeepSpeed plugins per Accelerator (Accelerate's ``deepspeed_plugins``).

The launched jobs (``deepspeed_plugins_script.py``) train a student under ZeRO-2 against a
frozen teacher running inference under ZeRO-3, and a peer under ZeRO-3 through a second
Accelerator, in one loop: on 2 processes (saving both states mid-run) and on 1, then the
2-process run resumed in a fresh launch. Argument checks run in-process without DeepSpeed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from launched_jobs import Jobs, run_waves

import accel.utils.deepspeed
from accel import Accelerator
from accel.errors import AcceleratorConfigError
from accel.strategies.deepspeed.config import (
    KnownValues,
    accumulation_steps,
    plugin_accumulation_steps,
    resolve_config,
)
from accel.strategies.deepspeed.named_plugins import (
    one_deepspeed_argument,
    refuse_plugins_for_existing_state,
    split_deepspeed_plugins,
)
from accel.utils import DeepSpeedEngineWrapper
from accel.utils.deepspeed import DeepSpeedPlugin

SCRIPT = Path(__file__).resolve().parent / "deepspeed_plugins_script.py"
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'accel[deepspeed]')",
)


# ---------------------------------------------------------------------- in-process
def test_a_dict_of_plugins_selects_its_first_and_bad_entries_are_named() -> None:
    first, second = DeepSpeedPlugin(zero_stage=2), DeepSpeedPlugin(zero_stage=3)
    active, named = split_deepspeed_plugins({"a": first, "b": second}, None)
    assert active is first and named == {"a": first, "b": second}
    assert (first.selected, second.selected) == (True, False)
    single, none = split_deepspeed_plugins(None, second)
    assert single is second and none is None
    with pytest.raises(AcceleratorConfigError, match="both given"):
        split_deepspeed_plugins(first, {"b": second})
    with pytest.raises(AcceleratorConfigError, match="both given"):
        one_deepspeed_argument(first, {"b": second})
    with pytest.raises(AcceleratorConfigError, match="at least one"):
        split_deepspeed_plugins({}, None)
    with pytest.raises(AcceleratorConfigError, match="entry 'b'"):
        split_deepspeed_plugins({"a": first, "b": {"zero_stage": 3}}, None)
    with pytest.raises(AcceleratorConfigError, match="select_deepspeed_plugin"):
        second.select()


def test_config_edits_before_prepare_reach_the_plugin_config() -> None:
    plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": "auto"})
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 8
    assert plugin.config_file == {"train_micro_batch_size_per_gpu": 8}
    # A plugin of fields only has a dict too, built from its fields with "auto" batch sizes as
    # in Accelerate (transformers fills those; Accelerate's scripts write into it).
    fields = DeepSpeedPlugin(zero_stage=3)
    assert fields.deepspeed_config == {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 3},
    }
    assert fields.hf_ds_config.config is fields.deepspeed_config
    fields.deepspeed_config["train_micro_batch_size_per_gpu"] = 2
    resolved = resolve_config(fields, KnownValues(None, 1, "no", 2))
    assert resolved["train_micro_batch_size_per_gpu"] == 2
    assert resolved["zero_optimization"]["stage"] == 3


def test_a_later_accelerator_cannot_bring_other_plugins() -> None:
    first, second = DeepSpeedPlugin(zero_stage=2), DeepSpeedPlugin(zero_stage=3)
    shared = {"deepspeed_plugins": {"a": first, "b": second}, "deepspeed_plugin": first}
    refuse_plugins_for_existing_state(shared, None)  # Accelerator(): shares them
    refuse_plugins_for_existing_state(shared, {"a": first, "b": second})  # the same ones
    with pytest.raises(AcceleratorConfigError, match=r"the plugins \['a', 'b'\].*Accelerator\(\)"):
        refuse_plugins_for_existing_state(shared, {"a": first})
    with pytest.raises(AcceleratorConfigError, match="no DeepSpeed plugin"):
        refuse_plugins_for_existing_state({"deepspeed_plugin": None}, first)


def test_accumulation_steps_a_plugin_sets_itself() -> None:
    assert plugin_accumulation_steps(DeepSpeedPlugin()) is None
    auto = DeepSpeedPlugin(hf_ds_config={"gradient_accumulation_steps": "auto"})
    assert plugin_accumulation_steps(auto) is None and accumulation_steps(auto, 3) == 3
    assert plugin_accumulation_steps(DeepSpeedPlugin(gradient_accumulation_steps=4)) == 4
    both = DeepSpeedPlugin(
        hf_ds_config={"gradient_accumulation_steps": 2}, gradient_accumulation_steps=4
    )
    with pytest.raises(AcceleratorConfigError, match="disagrees"):
        plugin_accumulation_steps(both)


def test_engine_wrapper_exists_only_under_deepspeed() -> None:
    accelerator = Accelerator(cpu=True)
    assert not hasattr(accelerator, "deepspeed_engine_wrapped")  # as in Accelerate
    with pytest.raises(AcceleratorConfigError, match="only be set under DeepSpeed"):
        accelerator.deepspeed_engine_wrapped = None
    assert accelerator.deepspeed_plugin is None
    # Defined in the DeepSpeed strategy's domain; Accelerate's path is a door to it.
    assert DeepSpeedEngineWrapper.__module__ == "accel.strategies.deepspeed.plugin"
    assert accel.utils.deepspeed.DeepSpeedEngineWrapper is DeepSpeedEngineWrapper


# ---------------------------------------------------------------------- launched jobs
@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both runs side by side (2 processes saving after step 3, 1 process), then the resume."""
    root = tmp_path_factory.mktemp("deepspeed_plugins")
    checkpoint = ["--save-at", "3", "--checkpoint", str(root / "checkpoint")]
    waves: list[Jobs] = [
        {"two": ([], checkpoint), "one": ([], [])},
        {"resumed": ([], ["--save-at", "3", "--resume", str(root / "checkpoint")])},
    ]
    reports: dict[str, Any] = {"_root": root}
    reports.update(run_waves(SCRIPT, root, waves, processes={"one": 1}))
    return reports


def _report(jobs: dict[str, Any], name: str) -> dict[str, Any]:
    report = jobs[name]
    assert "failed" not in report, f"{name} job failed: {report.get('failed')}"
    return report  # type: ignore[no-any-return]


RUNS = ["two", "one"]


@needs_deepspeed
@pytest.mark.timeout(1800)  # the first test pays for the module's jobs
@pytest.mark.parametrize("run", RUNS)
def test_plugins_are_selected_and_looked_up_by_name(jobs: dict[str, Any], run: str) -> None:
    report = _report(jobs, run)
    assert report["distributed_type"] == "DEEPSPEED"
    assert report["num_processes"] == {"two": 2, "one": 1}[run]
    assert report["names"] == ["student", "teacher", "peer", "mismatched"] and report["lookup"]
    assert report["first_selected"] and report["flags"] == [True, False, False, False]
    assert report["switched"] == [False, True, False, False] and report["active_is_teacher"]


@needs_deepspeed
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("run", RUNS)
def test_each_engine_got_its_own_plugin_config(jobs: dict[str, Any], run: str) -> None:
    report = _report(jobs, run)
    assert report["classes"] == dict.fromkeys(("student", "teacher", "peer"), "DeepSpeedEngine")
    assert report["stages"] == {"student": 2, "teacher": 3, "peer": 3}
    assert report["configs"] == report["stages"]  # each plugin's resolved config
    # is_train_batch_min: the eval loader's 2 per process beats the training loader's 4; the
    # teacher's "auto" micro batch comes from the student's engine, the peer's from the
    # student's config (set before its prepare, as in Accelerate's script).
    assert report["micro_batches"] == {"student": 2, "teacher": 2, "peer": 2}
    assert report["accumulation"] == {"student": 2, "teacher": 2, "peer": 2}


@needs_deepspeed
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("run", RUNS)
def test_two_accelerators_each_backward_their_own_engine(jobs: dict[str, Any], run: str) -> None:
    report = _report(jobs, run)
    assert report["wrapped_before"] == [None, None]  # deepspeed_engine_wrapped before prepare
    assert report["wrapped_engines"] == [True, True]
    # Each engine stepped once per 2 micro-steps: backward reached the right engine.
    assert report["global_steps"] == {"student": 6, "peer": 6}
    assert report["teacher_max_error"] < 1e-6  # the sharded teacher computes the same outputs
    assert report["teacher_state_dict_error"] == 0.0  # get_state_dict gathers its shards
    for name in ("student", "peer"):
        losses = report["losses"][name]
        assert len(losses) == 6 and losses[-1] < losses[0] / 2, (name, losses)
        assert report["evaluation"][name] < losses[0]  # evaluated under no_grad
    # 6 optimizer steps; a torch schedule steps once per process per step (Accelerate's rule).
    expected_lr = 0.05 / (1 + 0.1 * 6 * report["num_processes"])
    assert report["learning_rates"] == [pytest.approx(expected_lr)] * 2


@needs_deepspeed
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("run", RUNS)
def test_misuse_gets_errors_naming_the_fix(jobs: dict[str, Any], run: str) -> None:
    misuse = _report(jobs, run)["misuse"]
    names = "['student', 'teacher', 'peer', 'mismatched']"
    assert "select_deepspeed_plugin('missing')" in misuse["select_unknown"]
    assert names in misuse["select_unknown"]
    assert "get_deepspeed_plugin('missing')" in misuse["get_unknown"]
    assert "select_deepspeed_plugin(name)" in misuse["select_directly"]
    assert "already exists with the plugins" in misuse["new_plugins"]
    assert misuse["second_model"].startswith("PreparationError")
    assert "already holds a DeepSpeed engine" in misuse["second_model"]
    assert "second Accelerator()" in misuse["second_model"]
    assert "'student' (selected now) already trains" in misuse["plugin_in_use"]
    mismatched = misuse["mismatched_accumulation"]
    assert "'mismatched' asks for gradient_accumulation_steps=4" in mismatched
    assert "plugin 'student' already trains with 2" in mismatched
    assert "gradient_accumulation_steps=3" in misuse["accumulation_argument"]
    # The refused Accelerator left the live engines' accumulation count as it was.
    assert _report(jobs, run)["num_steps_after_refusal"] == 2
    # free_memory destroyed the peer's engine: its plugin trains a new model elsewhere.
    assert _report(jobs, run)["after_free_memory"] == [True, True, 3]


@needs_deepspeed
@pytest.mark.timeout(1800)
def test_both_states_resume_in_a_fresh_launch(jobs: dict[str, Any]) -> None:
    full, resumed = _report(jobs, "two"), _report(jobs, "resumed")
    assert resumed["first_step"] == 3
    for name in ("student", "peer"):
        torch.testing.assert_close(
            torch.tensor(resumed["losses"][name]),
            torch.tensor(full["losses"][name][3:]),
            rtol=1e-6,
            atol=1e-7,
        )
    # The teacher started from other weights: its inference engine's weights were loaded.
    assert resumed["teacher_max_error"] < 1e-6
    assert resumed["global_steps"] == full["global_steps"]
    assert resumed["learning_rates"] == pytest.approx(full["learning_rates"])
    torch.testing.assert_close(
        torch.tensor(list(resumed["evaluation"].values())),
        torch.tensor(list(full["evaluation"].values())),
        rtol=1e-5,
        atol=1e-7,
    )
    checkpoint = Path(jobs["_root"]) / "checkpoint"
    assert (checkpoint / "student" / "deepspeed" / "engine").is_dir()
    assert (checkpoint / "student" / "deepspeed_inference_0" / "model.safetensors").is_file()
    assert (checkpoint / "peer" / "deepspeed" / "engine").is_dir()
