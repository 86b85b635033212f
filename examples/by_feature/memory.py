"""Find the largest batch that fits in memory: ``find_executable_batch_size`` retries smaller.

The decorated function receives ``batch_size`` as its first argument; when it raises an
out-of-memory error, the decorator frees memory and calls it again with a smaller batch
(``reduce_batch_size_fn`` decides how much smaller). Everything that depends on the batch size,
the dataloaders and their preparation, goes inside the function.

A CPU does not run out of memory the way a GPU does, so ``--memory_limit`` stands in for a device
that holds that many samples at once: a larger batch raises the ``torch.OutOfMemoryError`` a GPU
would raise. On a GPU, leave it out and the real error does the same.

    accel launch --cpu --num_processes 2 examples/by_feature/memory.py --memory_limit 100
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import find_executable_batch_size, set_seed


def digits() -> TensorDataset:
    data = load_digits()
    return TensorDataset(
        torch.tensor(data.data, dtype=torch.float32) / 16.0, torch.tensor(data.target)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starting_batch_size", type=int, default=512)
    parser.add_argument(
        "--memory_limit", type=int, default=None, help="samples that fit (CPU stand-in)"
    )
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    accelerator = Accelerator()
    tried: list[int] = []

    @find_executable_batch_size(
        starting_batch_size=args.starting_batch_size,
        reduce_batch_size_fn=lambda: tried[-1] // 2,  # halve on each failure (default: x 0.9)
    )
    def train(batch_size: int) -> float:
        tried.append(batch_size)
        accelerator.free_memory()  # drop references the failed attempt prepared
        set_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loader = DataLoader(digits(), batch_size=batch_size, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for _ in range(args.epochs):
            for features, labels in loader:
                if args.memory_limit is not None and len(labels) > args.memory_limit:
                    raise torch.OutOfMemoryError(
                        f"CPU stand-in: a batch of {len(labels)} needs more than the "
                        f"{args.memory_limit} samples that fit"
                    )
                loss = torch.nn.functional.cross_entropy(model(features), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        return loss.item()

    loss = train()  # no batch_size argument: the decorator supplies it
    accelerator.print(f"tried batch sizes {tried}")
    accelerator.print(f"trained with batch size {tried[-1]} per process, final loss {loss:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
