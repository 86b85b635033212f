"""Start a multi-process job from Python, without ``accel launch``: Accelerate's launch helpers.

``prepare_multi_gpu_env`` turns ``accel launch``'s flags into the environment a job needs (the
rendezvous address, ``WORLD_SIZE`` and the launch contract: here ``--cpu`` and bf16 autocast), and
``PrepareForLaunch`` wraps a training function so that ``torch.multiprocessing`` can start it as
rank ``i``. Each process then builds an ``Accelerator`` as under ``accel launch``, trains a small
classifier with DDP and reports its accuracy; the script checks every rank ended with the same
weights.

    python examples/by_feature/launch_helpers.py [--num_processes 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.multiprocessing as mp
from sklearn.datasets import load_breast_cancer
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import PrepareForLaunch, prepare_multi_gpu_env, set_seed
from accel_launch.launch_args import build_launch_parser


def train(report_dir: str) -> None:
    """One rank of the job: the same training script ``accel launch`` would run."""
    set_seed(0)
    accelerator = Accelerator()
    data = load_breast_cancer()
    features = torch.tensor(data.data, dtype=torch.float32)
    features = (features - features.mean(0)) / features.std(0)
    labels = torch.tensor(data.target)
    model = torch.nn.Sequential(torch.nn.Linear(30, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(features, labels), batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(3):
        for batch, target in loader:
            loss = torch.nn.functional.cross_entropy(model(batch), target)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():
        accuracy = (model(features).argmax(1) == labels).float().mean().item()
    weights = torch.cat(
        [p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]
    )
    torch.save(weights, os.path.join(report_dir, f"rank{accelerator.process_index}.pt"))
    accelerator.print(
        f"{accelerator.num_processes} processes, mixed precision {accelerator.mixed_precision}, "
        f"accuracy {accuracy:.3f}"
    )
    accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    count = parser.parse_args().num_processes
    args = build_launch_parser().parse_args(
        ["--cpu", "--num_processes", str(count), "--mixed_precision", "bf16", __file__]
    )
    os.environ.update(prepare_multi_gpu_env(args))
    with tempfile.TemporaryDirectory() as report_dir:
        mp.start_processes(
            PrepareForLaunch(train, distributed_type="MULTI_CPU"),
            args=(report_dir,),
            nprocs=count,
            start_method="spawn",
        )
        weights = [torch.load(os.path.join(report_dir, f"rank{i}.pt")) for i in range(count)]
    same = all(torch.equal(weights[0], other) for other in weights[1:])
    print(f"started {count} ranks on {args.master_addr}:{args.master_port}; same weights: {same}")


if __name__ == "__main__":
    main()
