"""Single-process behaviour of the Accelerator: arguments, prepare, accumulation, helpers."""

import datetime

import pytest
import torch
from torch.utils.data import DataLoader

from accel import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    Accelerator,
    AcceleratorConfigError,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
)


def _objects():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    loader = DataLoader(torch.arange(18, dtype=torch.float32).reshape(6, 3), batch_size=2)
    return model, optimizer, scheduler, loader


def test_single_process_properties():
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type is DistributedType.NO
    assert (
        accelerator.num_processes,
        accelerator.process_index,
        accelerator.local_process_index,
    ) == (1, 0, 0)
    assert (
        accelerator.is_main_process
        and accelerator.is_local_main_process
        and accelerator.is_last_process
    )
    assert not accelerator.use_distributed
    assert accelerator.device == torch.device("cpu")
    assert accelerator.mixed_precision == "no"
    assert accelerator.sync_gradients
    assert accelerator.gradient_accumulation_steps == 1
    assert not accelerator.optimizer_step_was_skipped


def test_prepare_keeps_order_types_and_never_wraps_twice():
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler, loader = _objects()
    prepared = accelerator.prepare(loader, scheduler, "untouched", optimizer, model)
    p_loader, p_scheduler, text, p_optimizer, p_model = prepared
    assert text == "untouched"
    assert isinstance(p_optimizer, AcceleratedOptimizer) and p_optimizer.optimizer is optimizer
    assert isinstance(p_scheduler, AcceleratedScheduler) and p_scheduler.optimizers == [p_optimizer]
    assert isinstance(p_model, torch.nn.Module)
    assert len(p_loader) == 3
    assert accelerator.prepare(model) is p_model
    assert accelerator.prepare(p_model) is p_model
    assert accelerator.prepare(optimizer) is p_optimizer
    assert accelerator.prepare(p_optimizer) is p_optimizer
    assert accelerator.prepare(loader) is p_loader
    assert accelerator.prepare(model) is accelerator.prepare(model)
    # Accelerate's marker on every prepared object, which transformers and its tests read.
    for obj in (p_loader, p_scheduler, p_optimizer, p_model):
        assert obj._is_accelerate_prepared is True
    assert not hasattr(text, "_is_accelerate_prepared")
    p_optimizer._is_overflow = True  # Accelerate's private name for step_was_skipped
    assert p_optimizer.step_was_skipped


def test_an_accelerator_and_its_loader_are_freed_without_the_garbage_collector():
    # Regression: the checkpointer held the Accelerator's bound method, a reference cycle
    # that kept the Accelerator and everything it prepared alive until a collection.
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        accelerator = Accelerator(cpu=True)
        loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2))
        batches = iter(loader)
        next(batches)
        refs = [weakref.ref(accelerator), weakref.ref(loader)]
        del accelerator, loader, batches
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


def test_device_placement_list_must_match():
    accelerator = Accelerator(cpu=True)
    model, *_ = _objects()
    with pytest.raises(Exception, match="device_placement has 2 entries for 1 objects"):
        accelerator.prepare(model, device_placement=[True, False])


def test_accumulation_steps_and_dataloader_end():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer, _, loader = _objects()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    syncs = []
    for _ in range(2):
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch).sum())
                optimizer.step()
                optimizer.zero_grad()
                syncs.append(accelerator.sync_gradients)
    # 3 batches per epoch with 4 accumulation steps: the end of each epoch forces a sync.
    assert syncs == [False, False, True, False, False, True]


def test_backward_divides_by_accumulation_steps():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = accelerator.prepare(torch.nn.Linear(1, 1, bias=False))
    accelerator.backward(model(torch.ones(1, 1)).sum())
    assert model.weight.grad.item() == pytest.approx(0.25)


def test_zero_grad_and_step_do_nothing_on_micro_steps():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, _, _ = _objects()
    model, optimizer = accelerator.prepare(model, optimizer)
    before = model.weight.detach().clone()
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 3)).sum())
        optimizer.step()
        optimizer.zero_grad()
    assert torch.equal(model.weight, before)
    assert model.weight.grad is not None
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 3)).sum())
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(model.weight, before)
    assert model.weight.grad is None


def test_scheduler_steps_num_processes_times_only_with_real_steps():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, scheduler, _ = _objects()
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    for _ in range(4):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 3)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert scheduler.scheduler.last_epoch == 2
    assert scheduler.get_last_lr() == [pytest.approx(0.1 / 3)]


def test_clip_grad_on_micro_steps_clips_as_accelerate():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(3, 1))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 3)).sum() * 100)
        micro = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        assert micro.item() > 1.0
        partial = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
        assert partial.item() == pytest.approx(1.0, rel=1e-4)
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 3)).sum() * 100)
        norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
    assert norm.item() > 1.0
    clipped = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    assert clipped.item() == pytest.approx(1.0, rel=1e-4)
    accelerator.clip_grad_value_(model.parameters(), 0.01)
    assert all(p.grad.abs().max() <= 0.01 for p in model.parameters())


def test_clipping_parameters_without_gradients_does_nothing():
    """Before the first backward (or after zero_grad), as clip_grad_norm_ returns 0 then."""
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(3, 1))
    accelerator.clip_grad_value_(model.parameters(), 0.01)  # torch's own raises on no gradients
    assert accelerator.clip_grad_norm_(model.parameters(), 1.0).item() == 0.0
    assert all(p.grad is None for p in model.parameters())


def test_argument_conflicts_are_errors():
    with pytest.raises(
        AcceleratorConfigError, match="gradient_accumulation_plugin were both given"
    ):
        Accelerator(
            cpu=True,
            gradient_accumulation_steps=2,
            gradient_accumulation_plugin=GradientAccumulationPlugin(3),
        )
    with pytest.raises(AcceleratorConfigError, match="split_batches=True contradicts"):
        Accelerator(
            cpu=True,
            split_batches=True,
            dataloader_config=DataLoaderConfiguration(split_batches=False),
        )
    with pytest.raises(AcceleratorConfigError, match="two DistributedDataParallelKwargs"):
        Accelerator(
            cpu=True,
            kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()],
        )
    with pytest.raises(AcceleratorConfigError, match="accepted"):
        Accelerator(cpu=True, kwargs_handlers=["not a handler"])
    with pytest.raises(AcceleratorConfigError, match="must be an integer >= 1"):
        GradientAccumulationPlugin(num_steps=0)
    with pytest.raises(AcceleratorConfigError, match="not a known tracker"):
        Accelerator(cpu=True, log_with="no-such-tracker")


def test_split_batches_argument_and_config_agree():
    accelerator = Accelerator(cpu=True, split_batches=True)
    assert accelerator.split_batches and accelerator.dataloader_config.split_batches
    from accel_state import reset_state

    reset_state()
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True)
    )
    assert accelerator.split_batches


def test_second_accelerator_with_other_precision_is_an_error():
    Accelerator(cpu=True, mixed_precision="bf16")
    with pytest.raises(AcceleratorConfigError, match="cannot be honoured"):
        Accelerator(cpu=True, mixed_precision="no")


def test_kwargs_handlers_only_report_changes():
    assert DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs() == {
        "find_unused_parameters": True
    }
    handler = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=5))
    assert handler.to_kwargs() == {"timeout": datetime.timedelta(seconds=5)}


def test_launcher_accumulation_steps_unless_explicit(monkeypatch):
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "3")
    assert Accelerator(cpu=True).gradient_accumulation_steps == 3
    from accel_state import reset_state

    reset_state()
    assert Accelerator(cpu=True, gradient_accumulation_steps=5).gradient_accumulation_steps == 5


def test_launcher_fsdp_in_a_single_process_runs_on_a_group_of_one(monkeypatch):
    import torch.distributed as dist

    from accel_state import reset_state

    monkeypatch.setenv("ACCEL_USE_FSDP", "1")
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type.value == "FSDP"
    assert dist.is_initialized() and dist.get_world_size() == 1
    reset_state()
    assert not dist.is_initialized()


def test_unwrap_through_compile():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model, backend="eager")
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model
    assert accelerator.unwrap_model(compiled) is compiled  # Accelerate keeps compile by default


def test_process_helpers_in_one_process(capsys):
    accelerator = Accelerator(cpu=True)
    accelerator.print("once")
    assert capsys.readouterr().out == "once\n"
    assert accelerator.on_main_process(lambda: 1)() == 1
    with accelerator.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    with accelerator.main_process_first():
        accelerator.wait_for_everyone()
    assert accelerator.gather(torch.tensor([1, 2])).tolist() == [1, 2]
    assert accelerator.reduce(torch.tensor([3.0])).tolist() == [3.0]
    model, optimizer, _, _ = _objects()
    accelerator.prepare(model, optimizer)
    assert accelerator.free_memory(model, optimizer) == [None, None]
    assert accelerator._models == [] and accelerator._optimizers == []


def test_a_new_object_reusing_a_dead_objects_id_is_prepared_afresh():
    # Rebinding `loader = accelerator.prepare(loader)` frees the original; a scheduler created
    # afterwards may get the same id and must still become a scheduler, not the old loader.
    import gc

    accelerator = Accelerator(cpu=True)
    model, optimizer, _, _ = _objects()
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(50):
        loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2))
        gc.collect()
        scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1))
        assert isinstance(scheduler, AcceleratedScheduler), type(scheduler)
        assert len(loader) == 4


def test_save_model_writes_the_weights_of_an_offloaded_model(tmp_path):
    # Regression: a module offloaded to disk kept meta tensors, and save_model refused them.
    from accel.big_modeling import load_checkpoint_and_dispatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )
    inputs = torch.randn(3, 3)
    model.eval()
    expected = model(inputs)
    accelerator = Accelerator(cpu=True)
    accelerator.save_model(model, tmp_path / "first")
    device_map = {"0": "cpu", "1": "disk", "2": "cpu"}
    load_checkpoint_and_dispatch(
        model, str(tmp_path / "first"), device_map=device_map, offload_folder=str(tmp_path / "off")
    )
    accelerator.save_model(model, tmp_path / "second")
    fresh = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )
    load_checkpoint_and_dispatch(fresh, str(tmp_path / "second"))
    fresh.eval()
    assert torch.allclose(fresh(inputs), expected, atol=1e-6)


def test_a_quantized_model_offloaded_to_cpu_or_disk_is_refused():
    # Accelerate refuses to train an 8-bit/4-bit model with CPU or disk offload (a ValueError).
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "disk"}
    with pytest.raises(AcceleratorConfigError, match="CPU or disk offload") as error:
        accelerator.prepare_model(model)
    assert isinstance(error.value, ValueError)


def test_save_and_load_custom_state_use_accelerates_file_names(tmp_path):
    from accel.checkpointing import load_custom_state, save_custom_state

    source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    save_custom_state(source, tmp_path, index=2)
    assert (tmp_path / "custom_checkpoint_2.pkl").is_file()
    load_custom_state(target, tmp_path, index=2)
    assert torch.equal(source.weight, target.weight)
