"""The everyday loop, run by Ray Train or by ``accel launch``: ``ray_everyday.py OUT [--ray]``.

``train_func`` prepares a tiny model, optimizer and loaders, trains two epochs, evaluates with
``gather_for_metrics``, saves the state into OUT (the trial folder under Ray) and reports the
metrics (``ray.train.report`` under Ray). Each process writes ``OUT/rank<N>.json`` with what it
saw; rank 0 writes the final weights to ``OUT/final``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import set_seed


def data(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(count, 8, generator=generator)
    targets = (inputs[:, :3] + 0.2 * torch.randn(count, 3, generator=generator)).argmax(dim=1)
    return TensorDataset(inputs, targets)


def train_func(config: dict[str, Any]) -> None:
    """The loop a Ray Train user writes around an Accelerator."""
    out = Path(config["out"])
    under_ray = bool(config.get("ray"))
    accelerator = Accelerator()
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train = DataLoader(data(96, 1), batch_size=8, shuffle=True)
    evaluation = DataLoader(data(37, 2), batch_size=8)  # 37: the last batch is uneven
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    for _ in range(2):
        model.train()
        for inputs, targets in train:
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
    correct = seen = 0
    for inputs, targets in evaluation:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=1)
        predictions, targets = accelerator.gather_for_metrics((predictions, targets))
        correct += int((predictions == targets).sum())
        seen += int(targets.numel())
    metrics = {"accuracy": correct / seen, "evaluated": seen}
    accelerator.save_state(str(out / "state"))
    accelerator.save_model(model, out / "final")
    record = {
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
        "device": str(accelerator.device),
        "ACCELERATE_TORCH_DEVICE": os.environ.get("ACCELERATE_TORCH_DEVICE"),
        "metrics": metrics,
    }
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    if under_ray:
        import ray.train

        ray.train.report(metrics)
    accelerator.end_training()


if __name__ == "__main__":
    train_func({"out": sys.argv[1]})
