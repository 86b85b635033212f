r"""Keep the effective batch when memory runs short: smaller micro-batches, more accumulation.

``find_executable_batch_size`` finds the micro-batch that fits; the accumulation steps are then
chosen so that micro-batch x steps stays the batch the run was designed for, so the
optimization (learning rate, number of optimizer steps) does not change with the hardware.

A CPU does not run out of memory the way a GPU does, so ``--memory_limit`` stands in for a device
that holds that many samples at once (a larger batch raises ``torch.OutOfMemoryError``). On a
GPU, leave it out and the real error does the same.

    accel launch --cpu --num_processes 2 examples/by_feature/automatic_gradient_accumulation.py \
        --batch_size 128 --memory_limit 100
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
    parser.add_argument("--batch_size", type=int, default=128, help="effective batch per process")
    parser.add_argument(
        "--memory_limit", type=int, default=None, help="samples that fit (CPU stand-in)"
    )
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    accelerator = Accelerator()
    observed: dict[str, int] = {}

    @find_executable_batch_size(starting_batch_size=args.batch_size)
    def train(micro_batch: int) -> float:
        accelerator.free_memory()
        steps = -(-args.batch_size // micro_batch)  # ceil: micro_batch x steps >= batch_size
        micro_batch = args.batch_size // steps  # and exactly batch_size when it divides
        accelerator.gradient_accumulation_steps = steps
        set_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        loader = DataLoader(digits(), batch_size=micro_batch, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        optimizer_steps = 0
        for _ in range(args.epochs):
            for features, labels in loader:
                if args.memory_limit is not None and len(labels) > args.memory_limit:
                    raise torch.OutOfMemoryError(
                        f"CPU stand-in: {len(labels)} samples do not fit in {args.memory_limit}"
                    )
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.cross_entropy(model(features), labels)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer_steps += int(accelerator.sync_gradients)
                    optimizer.zero_grad()
        observed.update(micro_batch=micro_batch, steps=steps, optimizer_steps=optimizer_steps)
        return loss.item()

    loss = train()
    accelerator.print(
        f"micro-batch {observed['micro_batch']} x {observed['steps']} accumulation steps = "
        f"effective batch {observed['micro_batch'] * observed['steps']} "
        f"(asked for {args.batch_size}); {observed['optimizer_steps']} optimizer steps; "
        f"final loss {loss:.4f}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
