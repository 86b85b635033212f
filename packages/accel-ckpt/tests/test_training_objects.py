"""The one registry of what a training state covers (``TrainingObjects``), and the Checkpointer on it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from accel_ckpt import (
    CheckpointContentsError,
    Checkpointer,
    InvalidArgumentError,
    ProjectConfiguration,
    TrainingObjects,
)


class Counter:
    """A custom object with a state."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def _filled() -> tuple[TrainingObjects, torch.nn.Module, torch.optim.Optimizer, Counter]:
    torch.manual_seed(0)
    objects = TrainingObjects()
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    objects.models.append(model)
    objects.models.append(torch.nn.Linear(2, 1))
    objects.optimizers.append(optimizer)
    counter = Counter(7)
    objects.register(counter)
    return objects, model, optimizer, counter


def test_names_follow_the_checkpoint_files() -> None:
    objects, model, optimizer, counter = _filled()
    named = objects.named()
    assert list(named) == ["model", "model_1", "optimizer", "custom_checkpoint"]
    assert named["model"] is model and named["optimizer"] is optimizer
    assert named["custom_checkpoint"] is counter
    assert list(objects.named(("model",))) == ["model", "model_1"]


def test_state_dict_round_trip_restores_every_object() -> None:
    objects, model, optimizer, counter = _filled()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    saved = copy.deepcopy(objects.state_dict())  # state_dict() shares the tensors
    weights = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    counter.value = 0
    objects.load_state_dict(saved)
    assert torch.equal(model.weight, weights)
    assert counter.value == 7
    assert optimizer.state_dict()["state"][0]["momentum_buffer"] is not None


def test_a_state_of_other_objects_is_refused_before_anything_loads() -> None:
    objects, _, _, counter = _filled()
    saved = objects.state_dict()
    del saved["model_1"]
    counter.value = 1
    with pytest.raises(CheckpointContentsError, match=r"missing: \['model_1'\]"):
        objects.load_state_dict(saved)
    assert counter.value == 1


def test_registering_an_object_without_state_names_it() -> None:
    with pytest.raises(InvalidArgumentError, match="Item at index 1, `object`"):
        TrainingObjects().register(Counter(), object())


def test_unknown_kind_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match="kind='weights'"):
        TrainingObjects().of_kind("weights")  # type: ignore[arg-type]


def test_replace_and_clear_touch_prepared_objects_only() -> None:
    objects, model, _, counter = _filled()
    other = torch.nn.Linear(3, 2)
    objects.replace(model, other)
    assert objects.models[0] is other
    objects.clear()
    assert objects.named() == {"custom_checkpoint": counter}


def test_checkpointer_saves_and_loads_what_its_registry_holds(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    checkpointer = Checkpointer(config)
    model = torch.nn.Linear(3, 2)
    checkpointer.objects.models.append(model)
    counter = Counter(5)
    checkpointer.register_for_checkpointing(counter)
    assert checkpointer.custom_objects == [counter]
    folder = checkpointer.save_state()
    weights = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    counter.value = 0
    checkpointer.load_state(folder)
    assert torch.equal(model.weight, weights)
    assert counter.value == 5
