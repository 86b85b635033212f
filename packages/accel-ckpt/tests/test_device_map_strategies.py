"""The one device-map planner of the loaders: strategies, dicts and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from big_model_helpers import TinyLM

from accel_ckpt import (
    DeviceMapError,
    get_balanced_memory,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from accel_ckpt.big_modeling.strategies import STRATEGIES, plan_device_map
from accel_ckpt.errors import InvalidArgumentError

NO_SPLIT = ["Block"]
BUDGET = {"cpu": 30_000}


def empty_lm() -> TinyLM:
    with init_empty_weights():
        return TinyLM().eval()


def test_strategies_plan_as_infer_auto_device_map() -> None:
    model = empty_lm()
    sequential = infer_auto_device_map(model, max_memory=BUDGET, no_split_module_classes=NO_SPLIT)
    balanced = infer_auto_device_map(
        model,
        max_memory=get_balanced_memory(model, max_memory=BUDGET, no_split_module_classes=NO_SPLIT),
        no_split_module_classes=NO_SPLIT,
    )
    assert STRATEGIES == ("auto", "balanced", "balanced_low_0", "sequential")
    for strategy in STRATEGIES:
        planned = plan_device_map(
            model, strategy, max_memory=BUDGET, no_split_module_classes=NO_SPLIT
        )
        assert planned == (sequential if strategy == "sequential" else balanced), strategy
    assert "disk" in sequential.values()


def test_sizing_dtypes_reach_the_planner() -> None:
    model = empty_lm()
    fp32 = plan_device_map(model, "auto", max_memory=BUDGET, no_split_module_classes=NO_SPLIT)
    half = plan_device_map(
        model, "auto", max_memory=BUDGET, no_split_module_classes=NO_SPLIT, dtype=torch.float16
    )
    special = {name: torch.float16 for name, _ in model.named_parameters()}
    by_name = plan_device_map(
        model, "auto", max_memory=BUDGET, no_split_module_classes=NO_SPLIT, special_dtypes=special
    )
    assert "disk" in fp32.values()
    assert set(half.values()) == {"cpu"} and by_name == half


def test_a_dict_is_checked_and_normalized() -> None:
    model = empty_lm()
    assert plan_device_map(model, {"": torch.device("cpu")}) == {"": "cpu"}
    with pytest.raises(DeviceMapError, match=r"'block.0'.*closest names.*'blocks.0'"):
        plan_device_map(model, {"": "cpu", "block.0": "cpu"})
    with pytest.warns(UserWarning, match="block.0"):
        lenient = plan_device_map(model, {"": "cpu", "block.0": "cpu"}, strict_keys=False)
    assert lenient == {"": "cpu", "block.0": "cpu"}
    with pytest.raises(DeviceMapError, match=r"does not place .*'blocks.2.ln.weight'"):
        plan_device_map(model, {"embed": "cpu", "blocks.0": "cpu"})


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="needs GPU 3 to be missing")
def test_invisible_gpus_are_refused() -> None:
    with pytest.raises(DeviceMapError, match="GPU 3 but"):
        plan_device_map(empty_lm(), {"": 3})


def test_bad_strategies_raise_one_error_class_for_every_loader(tmp_path: Path) -> None:
    model = empty_lm()
    for bad in ("fastest", 5, None):
        with pytest.raises(DeviceMapError, match=r"is not a strategy; use one of \['auto'"):
            plan_device_map(model, bad)  # type: ignore[arg-type]
    assert issubclass(DeviceMapError, InvalidArgumentError)  # what the bnb loader documented
    with pytest.raises(DeviceMapError, match="device_map='fastest' is not a strategy"):
        load_checkpoint_and_dispatch(model, tmp_path, device_map="fastest")
