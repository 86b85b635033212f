"""Features gated by torch version, asked for the way a user does, on the torch this leg runs.

On a torch that has the feature, the request works; on an older one (the ``torch_versions``
legs: 2.4 and 2.6) it fails at ``Accelerator(...)``/``prepare()`` with accel's
``TorchVersionError``, naming the feature, the torch found, the release needed and what works
instead; and that alternative works. The gates' data is tested in accel-state's
test_torch_compat.py; the docs' table made from it in tests-integration/docs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch_gate_workers

from accel.torch_compat import GATES, require_torch_feature
from accel_state.testing import spawn_workers
from accel_state.torch_compat import torch_version


def _check(gate_key: str, outcomes: list[tuple[str, str]]) -> None:
    gate = GATES[gate_key]
    for kind, message in outcomes:
        if gate.available(device_type="cpu"):  # these jobs run on the CPU
            assert kind == "ok", message
        else:
            assert kind == "TorchVersionError", (kind, message)
            assert message == gate.message(device_type="cpu")
            assert gate.feature in message and f"this is torch {torch_version()}" in message
            assert gate.alternative in message


def test_fsdp2_works_or_is_refused_naming_fsdp1_which_works():
    _check("fsdp2", spawn_workers(torch_gate_workers.fsdp2_job, 2, timeout=300))
    assert spawn_workers(torch_gate_workers.fsdp1_job, 2, timeout=300) == [("ok", "")] * 2


def test_a_device_mesh_works_or_is_refused_when_the_accelerator_is_made():
    outcomes = spawn_workers(torch_gate_workers.mesh_job, 2, timeout=300)
    gate = GATES["device_mesh"]
    for kind, message in outcomes:
        if gate.available(device_type="cpu"):
            assert kind == "ok", message
        else:  # raised by accel-state's ParallelMesh, under its own hierarchy
            assert kind == "TorchFeatureError", (kind, message)
            assert gate.message(device_type="cpu") == message


def test_require_torch_feature_refuses_an_unknown_key():
    try:
        require_torch_feature("fsdp3")
    except KeyError as error:
        assert "no such gate" in str(error) and "fsdp2" in str(error)
    else:
        raise AssertionError("an unknown gate key was accepted")


def test_import_and_the_plain_ddp_path_never_load_dtensor_from_accel(tmp_path):
    """``import accel``, then one process training, saving and loading under plain DDP
    settings: no module of accel imports DTensor (torch's own modules may, on newer torch)."""
    code = textwrap.dedent(
        f"""
        import importlib.abc, sys, traceback
        loaders = []
        class Watch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name in ("torch.distributed.tensor", "torch.distributed._tensor"):
                    frames = [f.filename for f in traceback.extract_stack()]
                    loaders.extend(f for f in frames if "/accel" in f and "/torch/" not in f)
                return None
        sys.meta_path.insert(0, Watch())
        import torch
        import accel
        accelerator = accel.Accelerator(cpu=True)
        model = torch.nn.Linear(2, 2)
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        accelerator.backward(model(torch.ones(1, 2)).sum())
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        accelerator.save_state({str(tmp_path / "state")!r})
        accelerator.load_state({str(tmp_path / "state")!r})
        print(sorted(set(loaders)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
