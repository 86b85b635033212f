"""Checkpoints of XLA tensors (xla leg: torch_xla 2.9, PJRT_DEVICE=CPU, one device).

Files are written from host copies (any reader opens them without torch_xla), and loading puts
the values back on the XLA device, bit for bit. ``xla(min_devices=2)`` needs a TPU VM.
"""

import pytest
import torch
import xla_workers
from ckpt_helpers import TiedLM, mlp, same
from safetensors.torch import load_file

from accel_ckpt import load_checkpoint_in_model, load_state, save_model, save_state
from accel_state import PartialState
from accel_state.testing import spawn_xla_workers

pytestmark = [pytest.mark.xla, pytest.mark.usefixtures("xla_state")]


def tied_lm(device: torch.device, seed: int) -> TiedLM:
    torch.manual_seed(seed)
    model = TiedLM().to(device)
    model.head.weight = model.embed.weight  # .to() on XLA makes new, untied parameters
    return model


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int = 0) -> None:
    """Two steps on the model's device (inputs drawn on the host, as a loader would)."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    for _ in range(2):
        tokens = torch.randint(0, 50, (4, 5), generator=generator).to(device)
        loss = model(tokens).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def on_device(model: torch.nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return all(tensor.device.type == "xla" for tensor in tensors)


def host_state(model: torch.nn.Module) -> dict:
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


def xla_runs() -> int:
    import torch_xla.debug.metrics as metrics

    return metrics.counter_value("ExecuteComputation") or 0


def test_save_model_writes_host_tensors_once_per_tie(tmp_path):
    device = PartialState().device
    model = tied_lm(device, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer)  # the update is traced, not yet run
    runs = xla_runs()
    files = save_model(model, tmp_path)
    assert xla_runs() - runs == 1  # one graph computes every pending tensor, then they are copied
    stored = load_file(files[0])  # plain safetensors, no torch_xla needed
    assert "head.weight" not in stored and {t.device.type for t in stored.values()} == {"cpu"}
    expected = host_state(model)
    assert same({k: v for k, v in expected.items() if k != "head.weight"}, stored)

    fresh = tied_lm(device, seed=1)
    load_checkpoint_in_model(fresh, tmp_path)
    assert on_device(fresh) and same(host_state(fresh), expected)
    assert fresh.head.weight is fresh.embed.weight


def test_pickled_weights_load_without_torch_xla(tmp_path):
    model = mlp().to(PartialState().device)
    save_model(model, tmp_path, safe_serialization=False)
    stored = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert {tensor.device.type for tensor in stored.values()} == {"cpu"}
    assert same(stored, host_state(model))


@pytest.mark.parametrize("blocking", [True, False])
def test_training_state_round_trip_on_the_device(tmp_path, blocking):
    import torch_xla.core.xla_model as xm

    device = PartialState().device
    model = tied_lm(device, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    train(model, optimizer)
    scheduler.step()
    xm.set_rng_state(1234)
    expected = {"model": host_state(model), "optimizer": optimizer.state_dict()}
    saved = save_state(
        tmp_path / "ckpt",
        models=[model],
        optimizers=[optimizer],
        schedulers=[scheduler],
        blocking=blocking,
    )
    folder = saved if blocking else saved.wait()
    saved_seed = xm.get_rng_state()  # a graph run advances it: compare with the one saved
    stored = load_file(folder / "model.safetensors")
    assert {tensor.device.type for tensor in stored.values()} == {"cpu"}

    xm.set_rng_state(99)
    fresh = tied_lm(device, seed=1)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=3)
    load_state(folder, models=[fresh], optimizers=[fresh_optimizer], schedulers=[fresh_scheduler])
    assert xm.get_rng_state() == saved_seed != 99
    assert on_device(fresh) and fresh.head.weight is fresh.embed.weight
    assert same(host_state(fresh), expected["model"])
    assert same(fresh_optimizer.state_dict(), expected["optimizer"])
    moments = fresh_optimizer.state[fresh.embed.weight]
    assert moments["exp_avg"].device.type == "xla"
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    # The optimizer still steps the model's own parameters: training continues identically.
    train(model, optimizer, seed=7)
    train(fresh, fresh_optimizer, seed=7)
    assert same(host_state(fresh), host_state(model))


def check_saved_and_loaded(results: list[dict]) -> None:
    assert [result["rank"] for result in results] == list(range(len(results)))
    assert all(result["equal"] and result["devices"] == ["xla"] for result in results)


def test_a_one_replica_job_saves_and_loads(tmp_path):
    check_saved_and_loaded([xla_workers.save_and_load(str(tmp_path / "c"))])  # the TPU worker


@pytest.mark.xla(min_devices=2)
def test_replicas_save_and_load_one_checkpoint(tmp_path):
    results = spawn_xla_workers(xla_workers.save_and_load, args=(str(tmp_path / "c"),), timeout=600)
    assert len(results) >= 2
    check_saved_and_loaded(results)
