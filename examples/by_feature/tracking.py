"""Log hyper-parameters and metrics to experiment trackers, once per job, from any process.

``Accelerator(log_with=..., project_dir=...)`` names the trackers; ``init_trackers`` starts them on
the main process with the run's configuration, ``accelerator.log`` records metrics (the other
processes' calls do nothing), ``end_training`` closes them. ``jsonl`` and ``csv`` need nothing
installed (one file each under ``<project_dir>/<run name>/``); ``tensorboard``, ``wandb`` (set
``WANDB_MODE=offline`` to stay local) and ``mlflow`` are the accel extras of those names.

    accel launch --cpu --num_processes 2 examples/by_feature/tracking.py --report_to jsonl csv
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_breast_cancer
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import set_seed


def breast_cancer(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's bundled breast cancer set, standardised; 25% held out."""
    data = load_breast_cancer()
    features = torch.tensor(data.data, dtype=torch.float32)
    features = (features - features.mean(0)) / features.std(0)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.75 * len(labels))
    train, test = order[:cut], order[cut:]
    return TensorDataset(features[train], labels[train]), TensorDataset(
        features[test], labels[test]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report_to", nargs="+", default=["jsonl"], help="tracker names, or all")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--project_dir", default="runs/tracking")
    args = parser.parse_args()

    set_seed(0)
    accelerator = Accelerator(log_with=args.report_to, project_dir=args.project_dir)
    config = {"epochs": args.epochs, "lr": args.lr, "processes": accelerator.num_processes}
    accelerator.init_trackers("breast_cancer", config=config)

    train_set, test_set = breast_cancer(seed=0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model,
        optimizer,
        DataLoader(train_set, batch_size=16, shuffle=True),
        DataLoader(test_set, batch_size=64),
    )
    step = 0
    for epoch in range(args.epochs):
        model.train()
        total_loss = torch.zeros((), device=accelerator.device)
        for features, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total_loss += loss.detach()
            step += 1
        model.eval()
        correct = count = 0
        with torch.no_grad():
            for features, labels in test_loader:
                predictions = model(features).argmax(-1)
                predictions, labels = accelerator.gather_for_metrics((predictions, labels))
                correct += int((predictions == labels).sum())
                count += len(labels)
        # The mean training loss over every process's batches, the accuracy over the test set.
        train_loss = accelerator.reduce(total_loss, reduction="mean").item() / len(train_loader)
        metrics = {"train_loss": train_loss, "accuracy": correct / count, "epoch": epoch}
        accelerator.log(metrics, step=step)  # written once, by the main process
        accelerator.print(f"epoch {epoch}: {metrics}")
    accelerator.print(f"logged {args.epochs} epochs to {', '.join(args.report_to)}")
    accelerator.end_training()  # closes the trackers


if __name__ == "__main__":
    main()
