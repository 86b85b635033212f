"""save_accelerator_state / load_accelerator_state: Accelerate's signatures on accel's format."""

import pytest
import torch

from accel_ckpt import InvalidArgumentError
from accel_ckpt.accelerator_state_io import load_accelerator_state, save_accelerator_state
from accel_state.torch_compat import safe_globals


def _objects(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    return model, optimizer, scheduler


def test_round_trip_restores_models_optimizers_schedulers_and_step(tmp_path):
    model, optimizer, scheduler = _objects(0)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    folder = save_accelerator_state(
        tmp_path / "ckpt", [model.state_dict()], [optimizer], [scheduler], [], 0, step=7
    )
    assert folder == tmp_path / "ckpt" and folder.is_dir()

    other, other_optimizer, other_scheduler = _objects(1)
    restored = load_accelerator_state(
        folder, [other], [other_optimizer], [other_scheduler], [], 0, map_location="cpu"
    )
    assert restored == {"step": 7}
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor)
    assert other_scheduler.state_dict() == scheduler.state_dict()
    saved = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(other_optimizer.state_dict()["state"][0]["exp_avg"], saved)


def test_load_refuses_arguments_it_does_not_take(tmp_path):
    model = _objects(0)[0]
    folder = save_accelerator_state(tmp_path / "c", [model.state_dict()], [], [], [], 0, 1)
    with pytest.raises(InvalidArgumentError, match="mmap"):
        load_accelerator_state(folder, [model], [], [], [], 0, load_kwargs={"mmap": True})
    with pytest.raises(InvalidArgumentError, match="assign"):
        load_accelerator_state(folder, [model], [], [], [], 0, assign=True)


def test_torch_safe_globals_let_weights_only_load_numpy_arrays_and_rng_states(tmp_path):
    np = pytest.importorskip("numpy")
    from accel_ckpt.pickle_io import TORCH_SAFE_GLOBALS

    path = tmp_path / "rng.pt"
    torch.save({"array": np.arange(3), "rng": np.random.get_state()}, path)
    with safe_globals(TORCH_SAFE_GLOBALS):
        loaded = torch.load(path, weights_only=True)
    assert loaded["array"].tolist() == [0, 1, 2]
    assert loaded["rng"][0] == "MT19937"


def test_get_module_class_from_name_finds_the_class_depth_first():
    from accel_ckpt.big_modeling.model_helpers import get_module_class_from_name

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

    model = torch.nn.Sequential(torch.nn.ReLU(), Block())
    assert get_module_class_from_name(model, "Block") is Block
    assert get_module_class_from_name(model, "Linear") is torch.nn.Linear
    assert get_module_class_from_name(model, "Sequential") is torch.nn.Sequential
    assert get_module_class_from_name(model, "Conv2d") is None
