"""Stop every process together when one of them decides to: ``set_trigger`` / ``check_trigger``.

A process that wants to stop (here: the main process, once the evaluation loss has not improved
for ``--patience`` evaluations) calls ``accelerator.set_trigger()``. ``check_trigger()`` is a
collective: it returns True on every process as soon as any one set the trigger, and resets it,
so all of them leave the loop at the same step and nobody waits in a collective for a peer that
already left.

    accel launch --cpu --num_processes 2 examples/by_feature/early_stopping.py --patience 2
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import set_seed


def digits(seed: int) -> tuple[TensorDataset, TensorDataset]:
    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return TensorDataset(features[train], labels[train]), TensorDataset(
        features[test], labels[test]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patience", type=int, default=2, help="evaluations without improvement")
    parser.add_argument("--max_epochs", type=int, default=50)
    args = parser.parse_args()
    set_seed(0)
    accelerator = Accelerator()
    train_set, test_set = digits(seed=0)
    # A model large enough to overfit, so the evaluation loss turns up after a few epochs.
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model,
        optimizer,
        DataLoader(train_set, batch_size=32, shuffle=True),
        DataLoader(test_set, batch_size=128),
    )
    best, bad_evaluations, epoch = float("inf"), 0, 0
    for epoch in range(args.max_epochs):
        model.train()
        for features, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        losses = []
        with torch.no_grad():
            for features, labels in test_loader:
                logits, labels = accelerator.gather_for_metrics((model(features), labels))
                losses.append(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
        eval_loss = (torch.stack(losses).sum() / len(test_set)).item()
        accelerator.print(f"epoch {epoch}: eval loss {eval_loss:.4f}")
        if accelerator.is_main_process:  # one process decides...
            if eval_loss < best:
                best, bad_evaluations = eval_loss, 0
            else:
                bad_evaluations += 1
            if bad_evaluations >= args.patience:
                accelerator.set_trigger()
        if accelerator.check_trigger():  # ...every process sees it here, at the same step
            print(f"process {accelerator.process_index} stops after epoch {epoch}", flush=True)
            break
    accelerator.print(
        f"stopped after epoch {epoch} of {args.max_epochs}; best eval loss {best:.4f}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
