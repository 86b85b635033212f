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


def test_load_state_takes_load_kwargs_and_model_kwargs(tmp_path):
    import pytest
    import torch

    from accel.errors import AcceleratorConfigError

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    accelerator.save_state(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(tmp_path / "ckpt", load_kwargs={"map_location": "cpu"}, strict=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    with pytest.raises(AcceleratorConfigError, match="mmap"):
        accelerator.load_state(tmp_path / "ckpt", load_kwargs={"mmap": True})
    with pytest.raises(AcceleratorConfigError, match="assign"):
        accelerator.load_state(tmp_path / "ckpt", assign=True)


def test_prepare_data_loader_passes_slice_fn_for_dispatch():
    import torch
    from torch.utils.data import DataLoader

    from accel import DataLoaderConfiguration

    calls: list[object] = []

    def first_rows(data: object, tensor_slice: slice, **kwargs: object) -> object:
        calls.append(tensor_slice)
        assert isinstance(data, torch.Tensor)
        return data[tensor_slice]

    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)
    )
    loader = accelerator.prepare_data_loader(
        DataLoader(torch.arange(8.0), batch_size=4), slice_fn_for_dispatch=first_rows
    )
    batches = [batch.tolist() for batch in loader]
    assert batches == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert calls, "the slice function given to prepare_data_loader was not used"
