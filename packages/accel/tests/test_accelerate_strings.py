"""Accelerate 1.15's enum strings and the small members scripts call (issue 28)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel import Accelerator
from accel.tracking import GeneralTracker
from accel.utils import DynamoBackend, GradientAccumulationPlugin, LoggerType


def test_logger_type_prints_its_value_and_is_not_a_string():
    assert str(LoggerType.WANDB) == "wandb"
    assert f"{LoggerType.TENSORBOARD}" == "tensorboard"
    assert LoggerType.WANDB != "wandb"  # as in Accelerate: compare .value
    assert LoggerType("mlflow") is LoggerType.MLFLOW
    assert "jsonl" in LoggerType.list()


def test_dynamo_backend_prints_its_value_and_compares_as_a_string():
    assert str(DynamoBackend.INDUCTOR) == "INDUCTOR"
    assert f"{DynamoBackend.NO}" == "NO"
    assert DynamoBackend.EAGER == "EAGER"
    assert DynamoBackend.list()[:2] == ["NO", "EAGER"]


def test_gradient_accumulation_plugin_to_dict_is_a_copy_of_every_field():
    plugin = GradientAccumulationPlugin(num_steps=3, sync_each_batch=True)
    as_dict = plugin.to_dict()
    assert as_dict == {
        "num_steps": 3,
        "adjust_scheduler": True,
        "sync_with_dataloader": True,
        "sync_each_batch": True,
    }
    as_dict["num_steps"] = 9
    assert plugin.num_steps == 3


class _LazyTracker(GeneralTracker):
    name = "lazy"

    def __init__(self) -> None:
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append("start")

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        self.events.append(f"config {dict(values)}")

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.events.append(f"log {dict(values)} {step}")


def test_init_trackers_starts_each_tracker_before_storing_its_config():
    tracker = _LazyTracker()
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("run", config={"lr": 0.1})
    accelerator.log({"loss": 1.0}, step=2)
    assert tracker.events == ["start", "config {'lr': 0.1}", "log {'loss': 1.0} 2"]
    assert LoggerType.JSONL.value == "jsonl"
