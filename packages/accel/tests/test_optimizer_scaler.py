"""AcceleratedOptimizer(scaler=...), patch_optimizer_step and move_to_device (Accelerate's API)."""

import pytest
import torch

from accel.optimizer import AcceleratedOptimizer, move_to_device, patch_optimizer_step


def _model_and_optimizer():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_patch_optimizer_step_records_the_call():
    model, optimizer = _model_and_optimizer()
    wrapper = AcceleratedOptimizer(optimizer)
    patched = patch_optimizer_step(wrapper, optimizer.step)
    wrapper._accelerate_step_called = False
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    patched()
    assert wrapper._accelerate_step_called is True
    assert not torch.equal(model.weight, before)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_scaler_steps_and_reports_a_skipped_step():
    model, optimizer = _model_and_optimizer()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    wrapper = AcceleratedOptimizer(optimizer, scaler=scaler)
    assert wrapper.scaler is scaler
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    before = model.weight.detach().clone()
    wrapper.step()
    assert not wrapper.step_was_skipped
    assert not torch.equal(model.weight, before)
    assert optimizer.step.__name__ == "step"  # the patch is removed after the step

    wrapper.zero_grad()
    scaler.scale(model(torch.full((1, 2), float("inf"))).sum()).backward()
    before = model.weight.detach().clone()
    wrapper.step()
    assert wrapper.step_was_skipped
    assert torch.equal(model.weight, before)
    assert scaler.get_scale() < 4.0


def test_move_to_device_moves_nested_state():
    state = {"step": 3, "exp_avg": [torch.ones(2)], "pair": (torch.zeros(1), "x")}
    moved = move_to_device(state, "cpu")
    assert moved["step"] == 3 and moved["pair"][1] == "x"
    assert moved["exp_avg"][0].device.type == "cpu"
    assert isinstance(moved["pair"], tuple)
