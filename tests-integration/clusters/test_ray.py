"""Ray Train runs the everyday loop on accel as ``accel launch`` does (``nox -s ray``).

``TorchTrainer`` with 2 CPU workers calls ``ray_everyday.train_func``; accel adopts the process
group Ray started and the device Ray names (``ACCELERATE_TORCH_DEVICE``). The same function under
``accel launch --num_processes 2`` gives the same metrics and bit-equal weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs ray[train]: run `nox -s ray`")
torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "ray_everyday.py"


def records(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(2)]


def run_under_ray(out: Path, storage: Path) -> None:
    """In a child process (Ray's workers import the script from its folder)."""
    code = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
import ray_everyday

ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2,
         runtime_env={{"env_vars": {{"PYTHONPATH": {str(HERE)!r}}}}})
trainer = TorchTrainer(
    ray_everyday.train_func,
    train_loop_config={{"out": {str(out)!r}, "ray": True}},
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={{"CPU": 1}}),
    run_config=RunConfig(name="everyday", storage_path={str(storage)!r}),
)
result = trainer.fit()
print("RAY METRICS", result.metrics, flush=True)
ray.shutdown()
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "RAY METRICS" in result.stdout, result.stdout[-3000:]


@pytest.mark.timeout(600)
def test_torch_trainer_with_two_workers_equals_accel_launch(tmp_path):
    from accel_state.testing.environ import without_launcher_variables

    storage = tmp_path / "ray_results"
    trial = storage / "everyday"  # the trial folder Ray's RunConfig names
    trial.mkdir(parents=True)
    run_under_ray(trial, storage)
    under_ray = records(trial)
    for rank, record in enumerate(under_ray):
        assert record["process_index"] == rank and record["num_processes"] == 2
        assert record["distributed_type"] == "MULTI_CPU"
        # Ray names each worker's device; accel uses it.
        assert record["ACCELERATE_TORCH_DEVICE"] is not None
        assert record["device"] == record["ACCELERATE_TORCH_DEVICE"]
    assert (trial / "state").is_dir()

    launched = tmp_path / "launched"
    launched.mkdir()
    env = without_launcher_variables(os.environ)
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf_home"))
    accel = Path(sys.executable).with_name("accel")
    result = subprocess.run(
        [str(accel), "launch", "--cpu", "--num_processes", "2", str(SCRIPT), str(launched)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    by_launch = records(launched)
    assert [r["metrics"] for r in under_ray] == [r["metrics"] for r in by_launch]
    assert under_ray[0]["metrics"]["evaluated"] == 37  # gather_for_metrics dropped the padding
    first = load_file(str(trial / "final" / "model.safetensors"))
    second = load_file(str(launched / "final" / "model.safetensors"))
    assert sorted(first) == sorted(second)
    assert all(torch.equal(first[name], second[name]) for name in first)
