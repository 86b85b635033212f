"""K-fold cross-validation: one model per fold, each evaluated on its held-out fold.

The folds come from scikit-learn's ``StratifiedKFold`` with a fixed seed, so every process builds
the same split; each fold prepares a fresh model, optimizer and dataloaders (``free_memory``
drops the previous fold's). The held-out predictions are gathered with ``gather_for_metrics``
(no duplicates from the padding of the last batch), and the script reports each fold's accuracy,
their mean, and the accuracy of the folds' averaged predictions on a separate test set.

    accel launch --cpu --num_processes 2 examples/by_feature/cross_validation.py --num_folds 3
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import StratifiedKFold, train_test_split
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import set_seed


def predict(
    accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class probabilities and labels of the whole set, gathered from every process."""
    model.eval()
    outputs, targets = [], []
    with torch.no_grad():
        for features, labels in loader:
            probabilities, labels = accelerator.gather_for_metrics(
                (model(features).softmax(-1), labels)
            )
            outputs.append(probabilities)
            targets.append(labels)
    return torch.cat(outputs), torch.cat(targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_folds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    accelerator = Accelerator()
    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target)
    rest, test = train_test_split(
        range(len(labels)), test_size=0.2, random_state=0, stratify=labels
    )
    rest, test = torch.tensor(rest), torch.tensor(test)
    test_loader = DataLoader(TensorDataset(features[test], labels[test]), batch_size=64)
    folds = StratifiedKFold(n_splits=args.num_folds, shuffle=True, random_state=0)

    fold_accuracies, test_probabilities = [], []
    for fold, (train_idx, held_idx) in enumerate(folds.split(rest, labels[rest])):
        set_seed(fold)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        train_loader = DataLoader(
            TensorDataset(features[rest[train_idx]], labels[rest[train_idx]]),
            batch_size=32,
            shuffle=True,
        )
        held_loader = DataLoader(
            TensorDataset(features[rest[held_idx]], labels[rest[held_idx]]), batch_size=64
        )
        model, optimizer, train_loader, held_loader, fold_test_loader = accelerator.prepare(
            model, optimizer, train_loader, held_loader, test_loader
        )
        for _ in range(args.epochs):
            model.train()
            for batch_features, batch_labels in train_loader:
                loss = torch.nn.functional.cross_entropy(model(batch_features), batch_labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        probabilities, targets = predict(accelerator, model, held_loader)
        fold_accuracies.append((probabilities.argmax(-1) == targets).float().mean().item())
        accelerator.print(
            f"fold {fold}: held-out accuracy {fold_accuracies[-1]:.4f} on {len(targets)} samples"
        )
        test_probabilities.append(predict(accelerator, model, fold_test_loader)[0])
        accelerator.free_memory(model, optimizer, train_loader, held_loader, fold_test_loader)

    mean = sum(fold_accuracies) / len(fold_accuracies)
    ensemble = torch.stack(test_probabilities).mean(0).argmax(-1)
    test_accuracy = (ensemble == labels[test].to(ensemble.device)).float().mean().item()
    accelerator.print(f"mean cross-validation accuracy {mean:.4f} over {args.num_folds} folds")
    accelerator.print(f"averaged folds on the test set: accuracy {test_accuracy:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
