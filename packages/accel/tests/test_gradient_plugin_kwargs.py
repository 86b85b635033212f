"""Accelerate's observable accumulation state: ``to_kwargs()``, ``plugin_kwargs`` (issue 57)."""

from __future__ import annotations

import pathlib

import pytest
import switch_training as run
import torch

from accel import Accelerator, GradientAccumulationPlugin
from accel.errors import AcceleratorConfigError
from accel.kwargs_handlers import KwargsHandler
from accel_state import GradientState


def test_default_plugin_has_no_kwargs_and_none_steps() -> None:
    plugin = GradientAccumulationPlugin()
    assert isinstance(plugin, KwargsHandler)
    assert plugin.num_steps is None
    assert (plugin.adjust_scheduler, plugin.sync_with_dataloader, plugin.sync_each_batch) == (
        True,
        True,
        False,
    )
    assert plugin.to_kwargs() == {}


@pytest.mark.parametrize(
    ("fields", "kwargs"),
    [
        ({"num_steps": 4, "adjust_scheduler": False}, {"num_steps": 4, "adjust_scheduler": False}),
        ({"num_steps": 1}, {"num_steps": 1}),  # 1 differs from the default None
        ({"num_steps": 2, "adjust_scheduler": True}, {"num_steps": 2}),  # True is the default
        ({"sync_with_dataloader": False}, {"sync_with_dataloader": False}),
        ({"sync_each_batch": True}, {"sync_each_batch": True}),
    ],
)
def test_to_kwargs_keeps_only_changed_fields(fields: dict, kwargs: dict) -> None:
    assert GradientAccumulationPlugin(**fields).to_kwargs() == kwargs


@pytest.mark.parametrize("steps", [0, -1, 2.0, "2"])
def test_bad_num_steps_is_refused(steps: object) -> None:
    with pytest.raises(AcceleratorConfigError, match="num_steps"):
        GradientAccumulationPlugin(num_steps=steps)  # type: ignore[arg-type]


def test_gradient_state_from_a_default_plugin_falls_back() -> None:
    state = GradientState(GradientAccumulationPlugin())
    assert state.plugin_kwargs == {}
    assert (state.num_steps, state.adjust_scheduler) == (1, False)
    assert (state.sync_with_dataloader, state.sync_each_batch) == (True, False)


@pytest.mark.parametrize("steps", [1, 3])
def test_accelerator_steps_give_accelerates_plugin_kwargs(steps: int) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=steps)
    assert accelerator.gradient_state.plugin_kwargs == {"num_steps": steps}
    assert accelerator.gradient_accumulation_steps == steps
    assert accelerator.gradient_state.adjust_scheduler is False


def test_accelerator_plugin_replaces_earlier_kwargs() -> None:
    Accelerator(cpu=True, gradient_accumulation_steps=4)
    plugin = GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert accelerator.gradient_state.plugin_kwargs == {
        "num_steps": 2,
        "sync_with_dataloader": False,
    }
    accelerator.gradient_accumulation_steps = 5
    assert GradientState().plugin_kwargs == {"num_steps": 5, "sync_with_dataloader": False}
    with pytest.raises(AcceleratorConfigError, match="gradient_accumulation_steps = None"):
        accelerator.gradient_accumulation_steps = None  # type: ignore[assignment]
    assert accelerator.gradient_accumulation_steps == 5
    with pytest.raises(AcceleratorConfigError, match="both given"):
        Accelerator(cpu=True, gradient_accumulation_steps=2, gradient_accumulation_plugin=plugin)


def _train(accelerator: Accelerator, micro_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for _ in range(micro_steps):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return scheduler.scheduler


def test_scheduler_with_default_plugin_steps_only_on_sync_steps() -> None:
    # Accelerate: on a micro-step without sync, _step_count grows only when
    # gradient_state.adjust_scheduler, which a plugin's to_kwargs() never sets.
    inner = _train(Accelerator(cpu=True, gradient_accumulation_steps=2), micro_steps=8)
    assert inner.last_epoch == 4
    assert inner._step_count == 1 + 4  # construction, then one step per optimizer step
    assert inner.get_last_lr() == [pytest.approx(1.0 / 5)]


def test_scheduler_counts_skipped_micro_steps_when_the_key_is_written() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    accelerator.gradient_state.plugin_kwargs["adjust_scheduler"] = True
    inner = _train(accelerator, micro_steps=8)
    assert inner.last_epoch == 4
    assert inner._step_count == 1 + 4 + 4


def test_scheduler_state_matches_the_one_accelerate_saved() -> None:
    # The same run as data/accelerate/make_fixture.py with Accelerate 1.15 (one process,
    # accumulation 2, 6 micro-steps): its scheduler.bin has _step_count 1 + 3, not 1 + 6.
    saved = pathlib.Path(__file__).parent / "data" / "accelerate" / "one_process_bin"
    theirs = torch.load(saved / "scheduler.bin", weights_only=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=run.ACCUMULATION)
    objects = accelerator.prepare(*run.build())
    run.train(accelerator, objects, run.STEPS_BEFORE)
    ours = objects[-1].state_dict()
    for key in ("last_epoch", "_step_count", "_last_lr"):
        assert ours[key] == pytest.approx(theirs[key]), key
