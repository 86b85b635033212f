"""The everyday loop on several test hosts: ``everyday.py OUT [--stop_after_epoch N] [hooks]``.

Trains a tiny classifier for ``--epochs`` epochs, evaluates after each with
``gather_for_metrics``, saves the state into ``OUT/state`` after each epoch and, when started
again, resumes from it (a fresh launch). ``--stop_after_epoch N`` ends the run after epoch N's
save, as a job stopped between two launches. At the end rank 0 writes ``OUT/metrics.json`` and the
final weights to ``OUT/final``.

Test hooks: ``--fail_on_host NAME`` raises before the Accelerator exists on that host (a machine
that fails before the process group forms); ``--step_delay S`` sleeps after each step, so that a
test can act mid-training; ``--slow_host NAME --slow_seconds S`` sleeps S more in each step on
that host only (a slow machine). Every rank appends its optimizer step count to
``OUT/steps-<rank>`` as it goes.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import set_seed


def data(count: int, seed: int) -> TensorDataset:
    """``count`` samples of 8 features, labelled by the largest of the first three."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(count, 8, generator=generator)
    targets = (inputs[:, :3] + 0.2 * torch.randn(count, 3, generator=generator)).argmax(dim=1)
    return TensorDataset(inputs, targets)


class Progress:
    """The epochs done, saved with the state."""

    def __init__(self) -> None:
        self.epochs_done = 0

    def state_dict(self) -> dict[str, int]:
        return {"epochs_done": self.epochs_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epochs_done = int(state["epochs_done"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--stop_after_epoch", type=int, default=0)
    parser.add_argument("--fail_on_host", default="")
    parser.add_argument("--step_delay", type=float, default=0.0)
    parser.add_argument("--slow_host", default="")
    parser.add_argument("--slow_seconds", type=float, default=0.0)
    args = parser.parse_args()
    if args.fail_on_host and socket.gethostname() == args.fail_on_host:
        raise RuntimeError(f"{args.fail_on_host} fails before the process group forms")
    slow = args.slow_seconds if socket.gethostname() == args.slow_host else 0.0

    accelerator = Accelerator()
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train = DataLoader(data(args.samples, 1), batch_size=4, shuffle=True)
    evaluation = DataLoader(data(37, 2), batch_size=4)  # 37: the last batch is uneven
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    state = args.out / "state"
    if state.exists():
        accelerator.load_state(str(state))
    history = []
    steps_file = args.out / f"steps-{accelerator.process_index}"
    for epoch in range(progress.epochs_done, args.epochs):
        model.train()
        train.set_epoch(epoch)
        for inputs, targets in train:
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            with steps_file.open("a") as handle:
                handle.write(f"{epoch}\n")
            if args.step_delay or slow:
                time.sleep(args.step_delay + slow)
        model.eval()
        correct = seen = 0
        for inputs, targets in evaluation:
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=1)
            predictions, targets = accelerator.gather_for_metrics((predictions, targets))
            correct += int((predictions == targets).sum())
            seen += int(targets.numel())
        history.append({"epoch": epoch, "accuracy": correct / seen, "evaluated": seen})
        progress.epochs_done = epoch + 1
        accelerator.save_state(str(state))
        if args.stop_after_epoch and progress.epochs_done == args.stop_after_epoch:
            break
    if accelerator.is_main_process:
        with (args.out / "metrics.json").open("a") as handle:
            handle.write(json.dumps({"world": accelerator.num_processes, "history": history}))
            handle.write("\n")
    if progress.epochs_done == args.epochs:
        accelerator.save_model(model, args.out / "final")
    accelerator.end_training()


if __name__ == "__main__":
    main()
