"""Ray Train runs ``everyday.train_func`` on a running Ray cluster.

``ray_trainer.py ADDRESS OUT STORAGE`` connects to the cluster at ADDRESS, runs a
``TorchTrainer`` with 2 workers of one CPU each, placed ``STRICT_SPREAD`` (one per node), and
keeps every checkpoint in STORAGE (a folder every node sees). It writes ``OUT/ray-result.json``:
the final metrics and each checkpoint's path with the metrics reported beside it, in order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import everyday  # noqa: E402


def main(address: str, out: Path, storage: Path) -> None:
    """Run the trainer and write its result (see the module docstring)."""
    ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    trainer = TorchTrainer(
        everyday.train_func,
        train_loop_config={"out": str(out), "ray": True},
        scaling_config=ScalingConfig(
            num_workers=2,
            use_gpu=False,
            resources_per_worker={"CPU": 1},
            placement_strategy="STRICT_SPREAD",
        ),
        run_config=RunConfig(
            name="everyday",
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
    )
    result = trainer.fit()
    checkpoints = [[checkpoint.path, metrics] for checkpoint, metrics in result.best_checkpoints]
    record = {"metrics": result.metrics, "checkpoints": checkpoints}
    (out / "ray-result.json").write_text(json.dumps(record))
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
