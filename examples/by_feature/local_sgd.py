"""Local SGD: each process takes several optimizer steps alone, then the models are averaged.

Inside ``with LocalSGD(accelerator, model, local_sgd_steps=K) as local_sgd:`` DDP does not
all-reduce gradients; ``local_sgd.step()`` after each optimizer step averages the parameters
across processes every K steps (and once more when the block ends). That is K times fewer
synchronisations, which pays off on slow interconnects. The script shows the models differ
between averages and agree after the block, and that the averaged model learns.

    accel launch --cpu --num_processes 2 examples/by_feature/local_sgd.py --local_sgd_steps 8
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.local_sgd import LocalSGD
from accel.utils import set_seed


def spread(accelerator: Accelerator, model: torch.nn.Module) -> float:
    """The largest difference of a parameter between processes (0 when they agree)."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = accelerator.gather(flat[None])
    return (everyone - everyone[0]).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    set_seed(0)
    accelerator = Accelerator()
    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model,
        optimizer,
        DataLoader(TensorDataset(features[train], labels[train]), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(features[test], labels[test]), batch_size=64),
    )
    largest_spread = 0.0
    with LocalSGD(accelerator, model, local_sgd_steps=args.local_sgd_steps) as local_sgd:
        for _ in range(args.epochs):
            model.train()
            for step, (batch, targets) in enumerate(train_loader, start=1):
                loss = torch.nn.functional.cross_entropy(model(batch), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()  # averages the parameters every local_sgd_steps steps
                if step % args.local_sgd_steps == args.local_sgd_steps // 2:  # between averages
                    largest_spread = max(largest_spread, spread(accelerator, model))
    after = spread(accelerator, model)  # the block's end averaged once more
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch, targets in test_loader:
            predictions, targets = accelerator.gather_for_metrics(
                (model(batch).argmax(-1), targets)
            )
            correct += int((predictions == targets).sum())
            total += len(targets)
    accelerator.print(f"parameters differed by up to {largest_spread:.2e} between averages")
    accelerator.print(f"parameter difference after the block {after:.2e}")
    accelerator.print(f"test accuracy {correct / total:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
