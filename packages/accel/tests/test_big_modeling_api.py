"""Big-model inference through Accelerate's import paths (defined in accel-ckpt)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import accel
import accel.big_modeling
import accel.hooks
import accel.utils
import accel_ckpt.big_modeling as defined


def test_names_live_where_accelerate_has_them() -> None:
    top = [
        "init_empty_weights",
        "init_on_device",
        "cpu_offload",
        "cpu_offload_with_hook",
        "disk_offload",
        "dispatch_model",
        "load_checkpoint_and_dispatch",
        "infer_auto_device_map",
    ]
    for name in top:
        assert getattr(accel, name) is getattr(defined, name), name
    for name in [
        "compute_module_sizes",
        "get_max_memory",
        "get_balanced_memory",
        "infer_auto_device_map",
        "find_tied_parameters",
        "set_module_tensor_to_device",
        "OffloadedWeightsLoader",
        "load_checkpoint_in_model",
    ]:
        assert callable(getattr(accel.utils, name)), name
    assert accel.big_modeling.dispatch_model is defined.dispatch_model
    assert accel.hooks.AlignDevicesHook is defined.AlignDevicesHook


def test_accelerate_style_script(tmp_path: Path) -> None:
    from accel import init_empty_weights, load_checkpoint_and_dispatch
    from accel.hooks import remove_hook_from_submodules

    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    accel_ckpt_save = __import__("accel_ckpt").save_model
    accel_ckpt_save(source, tmp_path / "ckpt")
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    model = load_checkpoint_and_dispatch(
        model,
        tmp_path / "ckpt",
        device_map={"0": "cpu", "1": "cpu", "2": "disk"},
        offload_folder=tmp_path / "offload",
    )
    sample = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(model(sample), source(sample))
    model_cpu, hook = accel.cpu_offload_with_hook(source, execution_device="cpu")
    assert torch.equal(model_cpu(sample), model(sample))
    hook.remove()
    remove_hook_from_submodules(model)
    assert model[2].weight.device.type == "cpu"
