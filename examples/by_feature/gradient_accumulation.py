r"""Accumulate gradients over several micro-batches: the step of a batch that does not fit at once.

Inside ``with accelerator.accumulate(model):`` the optimizer (and the scheduler) step only on
every N-th micro-batch and at the end of the dataloader, DDP skips its gradient all-reduce on the
other micro-batches, and ``accelerator.backward`` divides the loss by N. The script checks the
claim: after one epoch with batches of 8 accumulated 4 times, the weights equal those trained
with batches of 32 without accumulation (same data order), up to float rounding.

    accel launch --cpu --num_processes 2 examples/by_feature/gradient_accumulation.py \
        --gradient_accumulation_steps 4
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_wine
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.state import AcceleratorState
from accel.utils import set_seed


def wine() -> TensorDataset:
    """scikit-learn's bundled wine set (178 samples, 13 features), standardised."""
    data = load_wine()
    features = torch.tensor(data.data, dtype=torch.float32)
    features = (features - features.mean(0)) / features.std(0)
    return TensorDataset(features, torch.tensor(data.target))


def train(micro_batch: int, steps: int) -> tuple[torch.Tensor, int, float]:
    """One epoch; returns the final weights, the optimizer steps taken and the last loss."""
    AcceleratorState._reset_state()  # a fresh Accelerator with other settings in this process
    accelerator = Accelerator(gradient_accumulation_steps=steps)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(wine(), batch_size=micro_batch, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    optimizer_steps = 0
    for features, labels in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()  # a real step only when accelerator.sync_gradients
            optimizer_steps += int(accelerator.sync_gradients)
            optimizer.zero_grad()
    weights = torch.cat(
        [p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()]
    )
    return weights, optimizer_steps, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--micro_batch_size", type=int, default=8, help="per process")
    args = parser.parse_args()
    steps, micro = args.gradient_accumulation_steps, args.micro_batch_size

    accumulated, accumulated_steps, loss = train(micro, steps)
    large, large_steps, _ = train(micro * steps, 1)
    difference = (accumulated - large).abs().max().item()
    print_main = Accelerator().print
    print_main(
        f"micro-batches of {micro} x {steps} accumulation: {accumulated_steps} optimizer steps"
    )
    print_main(f"batches of {micro * steps}: {large_steps} optimizer steps")
    print_main(f"max weight difference {difference:.2e} (last loss {loss:.4f})")


if __name__ == "__main__":
    main()
