"""Compute metrics over the whole evaluation set when each process sees only its share.

A prepared evaluation loader gives each process its own slice; when the set does not divide
evenly, the last round is completed with samples from the start so that every process runs the
same number of batches. ``accelerator.gather_for_metrics`` gathers predictions and labels from
all processes and drops those duplicates, so a metric computed on its result is the metric of
the whole set, exactly: the script checks it against the same metric on one process.

    accel launch --cpu --num_processes 2 examples/by_feature/multi_process_metrics.py
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_iris
from sklearn.metrics import f1_score
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import set_seed


def main() -> None:
    set_seed(0)
    accelerator = Accelerator()
    data = load_iris()
    features = torch.tensor(data.data, dtype=torch.float32)
    features = (features - features.mean(0)) / features.std(0)
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, evaluation = order[:100], order[100:]  # 50 evaluation samples: not a multiple of 2 x 8
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-2)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(
        model,
        optimizer,
        DataLoader(TensorDataset(features[train], labels[train]), batch_size=10, shuffle=True),
        DataLoader(TensorDataset(features[evaluation], labels[evaluation]), batch_size=8),
    )
    for _ in range(20):
        for batch, targets in train_loader:
            loss = torch.nn.functional.cross_entropy(model(batch), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    model.eval()
    predictions, references, seen_here = [], [], 0
    with torch.no_grad():
        for batch, targets in eval_loader:
            seen_here += len(targets)  # this process's share, padding included
            gathered = accelerator.gather_for_metrics((model(batch).argmax(-1), targets))
            predictions.append(gathered[0])
            references.append(gathered[1])
    predictions, references = torch.cat(predictions).cpu(), torch.cat(references).cpu()
    f1 = f1_score(references, predictions, average="macro")

    # The same metric on the unsplit set, computed by this process alone.
    plain = accelerator.unwrap_model(model)
    with torch.no_grad():
        single = plain(features[evaluation].to(accelerator.device)).argmax(-1).cpu()
    single_f1 = f1_score(labels[evaluation], single, average="macro")
    print(f"process {accelerator.process_index} evaluated {seen_here} samples", flush=True)
    accelerator.print(f"gathered {len(references)} predictions for {len(evaluation)} samples")
    accelerator.print(f"macro F1 {f1:.4f} gathered, {single_f1:.4f} on one process")
    accelerator.end_training()


if __name__ == "__main__":
    main()
