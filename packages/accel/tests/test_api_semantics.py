"""Accelerate's semantics (issue 13, items 3-7), on 1 and 2 real processes and in-process."""

import json
import logging
import pathlib

import pytest
import semantics_workers as workers
import switch_training as run
import torch

from accel import Accelerator, AcceleratorConfigError, GradScalerKwargs
from accel.logging import get_logger
from accel.utils import extract_model_from_parallel, find_executable_batch_size
from accel.utils.memory import should_reduce_batch_size
from accel_state.testing import spawn_workers

FIXTURES = pathlib.Path(__file__).parent / "data" / "accelerate"
SIZES = pytest.mark.parametrize("world_size", [1, 2])


def _close(a, b):
    return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- item 3: a folder per rank
@SIZES
def test_each_rank_saves_and_loads_its_own_folder(tmp_path, world_size):
    results = spawn_workers(
        workers.per_rank_folders, world_size, args=(str(tmp_path),), timeout=180
    )
    for rank, out in enumerate(results):
        assert out["returned"] == "PosixPath" and out["path"] == str(tmp_path / f"rank{rank}")
        assert out["restored"]
        assert f"random_states_{rank}.safetensors" in out["files"]
        assert {"model.safetensors", "optimizer.safetensors"} <= set(out["files"])


# ---------------------------------------------------------------- item 4: clip every micro-step
@SIZES
def test_clip_grad_norm_clips_and_returns_the_norm_on_every_micro_step(world_size):
    results = spawn_workers(workers.clip_every_micro_step, world_size, args=(0.5,), timeout=180)
    for out in results:
        assert len(out["norms"]) == 6 and all(norm > 0.5 for norm in out["norms"])
        assert _close(out["norms"], out["reference_norms"]), out
        assert all(
            _close(a, b) for a, b in zip(out["weights"], out["reference_weights"], strict=True)
        )
        assert max(out["value_clipped"]) <= 0.01
    assert all(r["weights"] == results[0]["weights"] for r in results)


def test_fp16_micro_steps_clip_the_scaled_gradient_without_unscaling_it():
    accelerator = Accelerator(
        cpu=True,
        mixed_precision="fp16",
        gradient_accumulation_steps=2,
        kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)],
    )
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Linear(3, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(2, 3)).sum() * 10)
        true_norm = torch.sqrt(sum((p.grad / 1024).pow(2).sum() for p in model.parameters()))
        norm = accelerator.clip_grad_norm_(model.parameters(), 0.5)
        assert norm.item() == pytest.approx(true_norm.item(), rel=1e-4)
        clipped = torch.sqrt(sum((p.grad / 1024).pow(2).sum() for p in model.parameters()))
        assert clipped.item() == pytest.approx(0.5, rel=1e-4)
        optimizer.step()
    before = [p.detach().clone() for p in model.parameters()]
    with accelerator.accumulate(model):  # the sync step unscales once and steps
        accelerator.backward(model(torch.ones(2, 3)).sum())
        assert accelerator.clip_grad_norm_(model.parameters(), 0.5).item() > 0
        optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# ---------------------------------------------------------------- item 5: batch size finder
def test_find_executable_batch_size_multiplies_by_0_9_and_remembers():
    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, label):
        tried.append(batch_size)
        if batch_size > 90:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
        return f"{label}:{batch_size}"

    assert train("a") == "a:82"
    assert tried == [128, 115, 103, 92, 82]
    assert train("b") == "b:82" and tried[-1] == 82  # the next call starts from what fitted

    calls = []

    def smaller():
        calls.append("called")
        return 7

    @find_executable_batch_size(starting_batch_size=16, reduce_batch_size_fn=smaller)
    def custom(batch_size):
        if batch_size > 8:
            raise RuntimeError("XPU out of memory. Tried to allocate 1 GiB")
        return batch_size

    assert custom() == 7 and calls == ["called"]


@pytest.mark.parametrize(
    "message",
    [
        "CUDA out of memory. Tried to allocate 20.00 MiB",
        "HIP out of memory. Tried to allocate 2.00 GiB",
        "XPU out of memory. Tried to allocate 2.00 GiB",
        "MPS backend out of memory (MPS allocated: 1 GB)",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ...",
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory",
        "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
    ],
)
def test_should_reduce_batch_size_knows_every_out_of_memory(message):
    assert should_reduce_batch_size(RuntimeError(message))
    assert not should_reduce_batch_size(ValueError(message))
    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))


# ---------------------------------------------------------------- item 6: names and small rules
@SIZES
def test_keyword_names_through_the_accelerator_and_accel_utils(world_size):
    results = spawn_workers(workers.keyword_names, world_size, timeout=180)
    ranks = [float(r) for r in range(world_size)]
    for rank, out in enumerate(results):
        assert out["gather"] == out["utils_gather"] == ranks
        assert out["reduce"] == [sum(ranks)]
        assert out["utils_reduce"] == [sum(ranks) / world_size + 1]
        assert out["utils_broadcast"] == [0.0]
        assert (
            out["pad"] == out["utils_pad"] == [1.0] * (rank + 1) + [-1.0] * (world_size - rank - 1)
        )
        assert out["utils_send"] == [float(rank)]
        assert out["utils_objects"] == list(range(world_size))


@SIZES
def test_small_semantics_in_an_accelerate_style_script(world_size):
    results = spawn_workers(
        workers.small_semantics,
        world_size,
        timeout=240,
        env={"ACCELERATE_LOG_LEVEL": "info"},
    )
    for out in results:
        assert out["tried"] == [64, 57, 51, 45, 45]
        assert out["first"] == out["second"] == 45
        assert out["log_level"] == "INFO"
        assert out["compiled_kept"] == "OptimizedModule" and out["kept_wraps_raw"]
        expected_inside = "Linear" if world_size == 1 else "DistributedDataParallel"
        assert out["prepared_untouched"] == expected_inside
        assert out["plain_is_raw"] and out["extract_plain_is_raw"]
        assert out["state_dict_keys"] == ["bias", "weight"] and out["state_dict_equal"]
        prefix = "_orig_mod." + ("" if world_size == 1 else "module.")
        assert out["wrapped_keys"] == [prefix + "bias", prefix + "weight"]
        assert out["string"] == "abcde"


def test_unwrap_keeps_compile_by_default_and_extracts_recursively():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model, backend="eager")
    assert accelerator.unwrap_model(compiled) is compiled
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model
    assert extract_model_from_parallel(compiled) is compiled
    assert extract_model_from_parallel(compiled, keep_torch_compile=False) is model

    class Shard(torch.nn.Module):  # how FSDP-style wrappers hold a layer
        def __init__(self, module):
            super().__init__()
            self.module = module

    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(Shard(inner), torch.nn.ReLU())
    assert extract_model_from_parallel(outer)[0] is not inner
    unwrapped = extract_model_from_parallel(outer, recursive=True)
    assert unwrapped is outer and outer[0] is inner


def test_save_state_returns_a_path(tmp_path):
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    path = accelerator.save_state(tmp_path / "ckpt")
    assert isinstance(path, pathlib.Path) and path == tmp_path / "ckpt"


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


def test_get_logger_reads_accel_then_accelerate_log_level(monkeypatch, restore_logging):
    Accelerator(cpu=True)
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
    assert get_logger("semantics.a").logger.level == logging.DEBUG
    assert logging.getLogger().level == logging.DEBUG  # as Accelerate: the root too
    monkeypatch.setenv("ACCEL_LOG_LEVEL", "warning")
    assert get_logger("semantics.b").logger.level == logging.WARNING
    assert get_logger("semantics.c", log_level="ERROR").logger.level == logging.ERROR
    monkeypatch.setenv("ACCEL_LOG_LEVEL", "loud")
    with pytest.raises(
        AcceleratorConfigError, match="ACCEL_LOG_LEVEL='loud' is not a logging level"
    ):
        get_logger("semantics.d")


# ---------------------------------------------------------------- item 7: switch from Accelerate
def _fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize(("name", "world_size"), [("one_process_bin", 1), ("two_processes", 2)])
def test_training_goes_on_from_a_checkpoint_written_by_accelerate(tmp_path, name, world_size):
    expected = _fixture(name)
    assert expected["num_processes"] == world_size
    results = spawn_workers(
        workers.resume_from_accelerate,
        world_size,
        args=(str(FIXTURES / name), str(tmp_path / "accel")),
        timeout=240,
    )
    for rank, out in enumerate(results):
        theirs = expected["ranks"][rank]
        assert "UnsafeCheckpointError" in out["refusal"]
        assert "allow_pickle=True" in out["refusal"]
        assert out["state"] == theirs["state"]  # step, weights, moments, LR, counter: exact
        assert out["draws"] == theirs["draws"]  # python and numpy generators restored
        assert _close(out["losses_after"], theirs["losses_after"])  # torch generator too
        for ours, accelerate in zip(out["weights_after"], theirs["weights_after"], strict=True):
            assert _close(ours, accelerate)
        assert "accel_manifest.json" in out["resaved"]
        assert out["counter_after_reload"] == theirs["state"]["counter"]
        assert out["weights_after_reload"] == out["weights_after"]


def test_one_process_loads_the_state_of_a_two_process_accelerate_run():
    expected = _fixture("two_processes")["ranks"][0]
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=run.ACCUMULATION)
    objects = accelerator.prepare(*run.build())
    counter = run.Counter()
    accelerator.register_for_checkpointing(counter)
    accelerator.load_state(FIXTURES / "two_processes", allow_pickle=True)
    state = json.loads(json.dumps(run.snapshot(accelerator, objects, counter)))
    assert state == expected["state"]
    assert run.draws() == expected["draws"]
