"""Several DeepSpeed plugins per Accelerator (Accelerate's ``deepspeed_plugins``).

One launched job (``deepspeed_plugins_script.py``, 2 CPU/gloo processes) trains a student under
ZeRO-2 against a teacher running inference under ZeRO-3; the asserts below read its report.
Argument checks run in-process without DeepSpeed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from launched_jobs import finish, start

from accel.deepspeed_plugins import split_deepspeed_plugins
from accel.errors import AcceleratorConfigError
from accel.utils.deepspeed import DeepSpeedPlugin

SCRIPT = Path(__file__).resolve().parent / "deepspeed_plugins_script.py"
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'accel[deepspeed]')",
)


def test_a_dict_of_plugins_selects_its_first_and_bad_entries_are_named() -> None:
    first, second = DeepSpeedPlugin(zero_stage=2), DeepSpeedPlugin(zero_stage=3)
    active, named = split_deepspeed_plugins({"a": first, "b": second}, None)
    assert active is first and named == {"a": first, "b": second}
    assert (first.selected, second.selected) == (True, False)
    single, none = split_deepspeed_plugins(None, second)
    assert single is second and none is None
    with pytest.raises(AcceleratorConfigError, match="both given"):
        split_deepspeed_plugins(first, {"b": second})
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


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("deepspeed_plugins")
    out = root / "report.json"
    job = start(SCRIPT, [], ["--out", str(out), "--checkpoint", str(root / "checkpoint")])
    result = finish(job, out, timeout=900)
    assert "failed" not in result, result.get("failed")
    return result


@needs_deepspeed
@pytest.mark.timeout(1000)
def test_selection_and_lookup_on_two_processes(report: dict[str, Any]) -> None:
    assert report["distributed_type"] == "DEEPSPEED"
    assert report["first_selected"] and report["flags"] == [True, False]
    assert report["switched"] == [False, True]
    assert report["names"] == ["training", "inference"] and report["lookup"]
    assert "select_deepspeed_plugin(name)" in report["errors"]["select_directly"]
    assert "'missing'" in report["errors"]["unknown_name"]
    assert "['training', 'inference']" in report["errors"]["unknown_name"]


@needs_deepspeed
@pytest.mark.timeout(1000)
def test_student_trains_under_zero2_against_a_zero3_teacher(report: dict[str, Any]) -> None:
    assert report["classes"] == ["DeepSpeedEngine", "DeepSpeedEngine"]
    assert report["stages"] == [2, 3] and report["configs"] == [2, 3]
    # is_train_batch_min: the eval loader's 2 per process beats the training loader's 4; the
    # inference engine's "auto" micro batch comes from the training engine.
    assert report["micro_batches"] == [2, 2]
    assert report["teacher_max_error"] < 1e-6  # the sharded teacher computes the same outputs
    losses = report["losses"]
    assert len(losses) == 8 and losses[-1] < losses[0] / 2
    assert report["evaluation"] < losses[0]
    assert report["restored"]  # save_state/load_state of the training engine
