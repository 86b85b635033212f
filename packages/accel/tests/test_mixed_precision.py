"""Mixed precision on the CPU: autocast dtypes, float32 outputs, fp16 loss scaling and skipped steps."""

import warnings

import pytest
import torch
from torch_support import torchao_skip_reason

from accel import Accelerator, AutocastKwargs, GradScalerKwargs


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(("mode", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_inside_and_float32_outputs(mode, dtype):
    accelerator = Accelerator(mixed_precision=mode, cpu=True)
    model, optimizer = _model_and_optimizer()
    seen = []
    model[0].register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    model, optimizer = accelerator.prepare(model, optimizer)
    output = model(torch.randn(3, 4))
    assert seen == [dtype]
    assert output.dtype == torch.float32
    with accelerator.autocast():
        assert torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype == dtype
    with accelerator.autocast(AutocastKwargs(enabled=False)):
        assert (
            torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype == torch.float32
        )
    assert accelerator.mixed_precision == mode
    assert (
        accelerator.unwrap_model(model, keep_fp32_wrapper=False)(torch.randn(3, 4)).dtype
        == torch.float32
    )
    seen.clear()
    accelerator.unwrap_model(model, keep_fp32_wrapper=False)(torch.randn(3, 4))
    assert seen == [torch.float32]


def test_fp16_scaler_skips_inf_steps_and_the_scheduler_waits():
    accelerator = Accelerator(
        mixed_precision="fp16", cpu=True, kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)]
    )
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    assert accelerator.scaler is not None and accelerator.scaler.get_scale() == 1024.0

    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(3, 4)).sum() * float("inf")
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    assert accelerator.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scheduler.get_last_lr() == [0.1]
    assert accelerator.scaler.get_scale() == 512.0

    accelerator.backward(model(torch.randn(3, 4)).sum())
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scheduler.get_last_lr() == [0.05]


def test_fp16_clip_grad_norm_unscales_first():
    # A small scale keeps fp16 gradients finite, so the unscaled norm is comparable.
    accelerator = Accelerator(
        mixed_precision="fp16", cpu=True, kwargs_handlers=[GradScalerKwargs(init_scale=64.0)]
    )
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(5, 4)
    accelerator.backward(model(x).sum())
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e9)
    reference, _ = _model_and_optimizer()
    reference(x).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=1e9)
    assert torch.allclose(norm, expected, rtol=1e-2)
    # A second clip before the step must not unscale twice.
    again = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e9)
    assert torch.allclose(again, expected, rtol=1e-2)
    optimizer.step()


def test_fp8_uses_torchao_with_bf16_autocast_for_the_rest():
    if (reason := torchao_skip_reason()) is not None:
        pytest.skip(reason)
    accelerator = Accelerator(mixed_precision="fp8", cpu=True)
    assert accelerator.mixed_precision == "fp8" and accelerator.native_amp
    assert accelerator.fp8_backend.value == "AO"
    assert accelerator.precision.autocast_dtype is torch.bfloat16  # see test_fp8.py


def test_launcher_precision_is_used_unless_an_argument_overrides_it(monkeypatch):
    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "bf16")
    assert Accelerator(cpu=True).mixed_precision == "bf16"
    from accel_state import reset_state

    reset_state()
    assert Accelerator(cpu=True, mixed_precision="no").mixed_precision == "no"


def test_fp16_skip_detection_follows_the_scaler_and_leaves_the_optimizer_as_it_was():
    accelerator = Accelerator(
        mixed_precision="fp16",
        cpu=True,
        kwargs_handlers=[GradScalerKwargs(init_scale=8.0, growth_interval=1)],
    )
    model, optimizer = _model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    inner = optimizer
    scheduler_step_wrapper = inner.__dict__.get("step")
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    for _ in range(2):  # two overflows in a row: both skipped, the scale halves each time
        accelerator.backward(model(torch.randn(3, 4)).sum() * float("inf"))
        optimizer.step()
        assert accelerator.optimizer_step_was_skipped
        optimizer.zero_grad()
    assert accelerator.scaler.get_scale() == 2.0

    # A good step grows the scale (growth_interval=1) and is not reported as skipped.
    accelerator.backward(model(torch.randn(3, 4)).sum())
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    assert accelerator.scaler.get_scale() == 4.0
    # What was on the optimizer instance before (the scheduler's step counter) is back in place.
    assert inner.__dict__.get("step") is scheduler_step_wrapper
    scheduler.step()
    assert scheduler.get_last_lr() == [0.05]


@pytest.mark.cuda
def test_fp16_step_synchronises_with_the_host_no_more_than_the_raw_scaler_loop():
    def count_syncs(step) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(warning.message) for warning in caught)

    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer = _model_and_optimizer()
    model, optimizer = accelerator.prepare(model, optimizer)
    reference, reference_optimizer = _model_and_optimizer()
    reference = reference.cuda()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")

    def raw_step() -> None:
        scaler.step(reference_optimizer)
        scaler.update()

    counts = []
    # The first step of each is a warm-up: the first CUDA call of a process may synchronise once
    # (lazy initialisation), whichever loop makes it.
    for _ in range(2):
        x = torch.randn(3, 4, device="cuda")
        accelerator.backward(model(x).sum())
        scaler.scale(reference(x).sum()).backward()
        counts.append((count_syncs(optimizer.step), count_syncs(raw_step)))
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    accel_syncs, raw_syncs = counts[-1]
    assert raw_syncs >= 1  # the scaler reads its inf/nan flag: the count can see syncs
    assert accel_syncs <= raw_syncs
