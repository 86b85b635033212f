"""Accelerator checkpoints through accel-ckpt: round trips, registration, naming, kill and resume."""

import pathlib

import pytest
import torch
from torch.utils.data import DataLoader

from accel import Accelerator
from accel.utils import ProjectConfiguration, load_checkpoint_in_model
from accel_state.testing import run_torchrun

HERE = pathlib.Path(__file__).parent


class Counter:
    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _train_a_bit(accelerator, model, optimizer, scheduler, loader, steps):
    for _, batch in zip(range(steps), loader, strict=False):
        loss = model(batch).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def _objects():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    loader = DataLoader(torch.randn(32, 3), batch_size=4, shuffle=True)
    return model, optimizer, scheduler, loader


def test_save_state_load_state_round_trip(tmp_path):
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    model, optimizer, scheduler, loader = accelerator.prepare(*_objects())
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    batches = iter(loader)
    for _ in range(3):
        accelerator.backward(model(next(batches)).pow(2).mean())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    counter.value = 42
    path = accelerator.save_state(str(tmp_path / "ckpt"))
    assert pathlib.Path(path).is_dir()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_lr = scheduler.get_last_lr()
    saved_moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    expected_next_batch = next(batches)  # what an uninterrupted run sees next (mid-epoch)
    _train_a_bit(accelerator, model, optimizer, scheduler, loader, 5)
    counter.value = 0
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_moments)
    assert scheduler.get_last_lr() == saved_lr
    assert counter.value == 42
    assert torch.equal(next(iter(loader)), expected_next_batch)


def test_register_for_checkpointing_names_the_bad_object():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(Exception, match="Item at index 1, `str`"):
        accelerator.register_for_checkpointing(Counter(), "no state here")


def test_hooks_run_before_save_and_load(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    calls = []
    save_handle = accelerator.register_save_state_pre_hook(
        lambda models, weights, folder: calls.append("save")
    )
    accelerator.register_load_state_pre_hook(lambda models, folder: calls.append("load"))
    accelerator.save_state(str(tmp_path / "a"))
    accelerator.load_state(str(tmp_path / "a"))
    save_handle.remove()
    accelerator.save_state(str(tmp_path / "b"))
    assert calls == ["save", "load"]
    assert model is not None


def test_automatic_naming_and_total_limit(tmp_path):
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    for _ in range(4):
        accelerator.save_state()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_2", "checkpoint_3"]
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state()
    assert not torch.equal(model.weight, torch.zeros_like(model.weight))


def test_save_model_and_load_checkpoint_in_model(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    )
    accelerator.wait_for_everyone()
    accelerator.save_model(model, tmp_path / "sharded", max_shard_size="10KB")
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert "model.safetensors.index.json" in files and len(files) > 2
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    load_checkpoint_in_model(fresh, tmp_path / "sharded", device_map={"": "cpu"})
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True)
    )
    accelerator.save({"answer": torch.tensor([42])}, tmp_path / "obj.pt")
    assert (tmp_path / "obj.pt").is_file()


def _losses_and_weights(stdout):
    losses = {}
    weights = None
    for line in stdout.splitlines():
        if line.startswith("LOSS "):
            _, step, value = line.split()
            losses[int(step)] = value
        elif line.startswith("WEIGHTS "):
            weights = line.removeprefix("WEIGHTS ")
    return losses, weights


def test_kill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    script = str(HERE / "resume_script.py")
    full = run_torchrun([script, str(tmp_path / "full")], nproc_per_node=2, timeout=240)
    assert full.returncode == 0, full.stderr[-3000:]
    full_losses, full_weights = _losses_and_weights(full.stdout)
    assert len(full_losses) == 15 and full_weights is not None  # 3 epochs x 40 / (4 x 2)

    killed = run_torchrun(
        [script, str(tmp_path / "run"), "--kill-at", "8"], nproc_per_node=2, timeout=240
    )
    assert killed.returncode != 0
    assert max(_losses_and_weights(killed.stdout)[0]) == 8
    resumed = run_torchrun(
        [script, str(tmp_path / "run"), "--resume"], nproc_per_node=2, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resumed_losses, resumed_weights = _losses_and_weights(resumed.stdout)
    # The checkpoint of micro-step 7 is the newest: the run continues mid-epoch at micro-step 8.
    assert min(resumed_losses) == 8
    assert {step: full_losses[step] for step in resumed_losses} == resumed_losses
    assert resumed_weights == full_weights
