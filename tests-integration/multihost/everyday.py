"""The everyday loop on several test hosts: ``everyday.py OUT [--stop_after_epoch N] [hooks]``.

Trains a tiny classifier for ``--epochs`` epochs, evaluates after each with
``gather_for_metrics``, saves the state into ``OUT/state`` after each epoch and, when started
again, resumes from it (a fresh launch), or from ``--resume_from FOLDER`` when ``OUT/state`` is
not there yet. ``--stop_after_epoch N`` ends the run after epoch N's save, as a job stopped
between two launches. At the end rank 0 writes ``OUT/metrics.json`` and the final weights to
``OUT/final``; every rank writes where it ran (hostname, device, world) to
``OUT/rank-<rank>.json``.

Ray Train calls :func:`train_func` with the same options as a dict (``{"out": ..., "ray":
True}``): after each epoch's save, rank 0 reports the state folder as the epoch's Ray checkpoint
and every rank reports the epoch's metrics.

Test hooks: ``--fail_on_host NAME`` raises before the Accelerator exists on that host (a machine
that fails before the process group forms); ``--step_delay S`` sleeps after each step, so that a
test can act mid-training; ``--slow_host NAME --slow_seconds S`` sleeps S more in each step on
that host only (a slow machine). Every rank appends its optimizer step count to
``OUT/steps-<rank>`` as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

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


def parser() -> argparse.ArgumentParser:
    """The script's options (Ray's ``train_loop_config`` takes the same, by ``dest``)."""
    options = argparse.ArgumentParser()
    options.add_argument("out", type=Path)
    options.add_argument("--epochs", type=int, default=2)
    options.add_argument("--samples", type=int, default=128)
    options.add_argument("--stop_after_epoch", type=int, default=0)
    options.add_argument("--fail_on_host", default="")
    options.add_argument("--step_delay", type=float, default=0.0)
    options.add_argument("--slow_host", default="")
    options.add_argument("--slow_seconds", type=float, default=0.0)
    options.add_argument("--resume_from", type=Path, default=None)
    options.add_argument("--ray", action="store_true", help="run under Ray Train (report)")
    return options


def train_func(config: dict[str, Any]) -> None:
    """Ray Train's entry: ``config`` holds the options by name (``out`` is required)."""
    defaults = parser().parse_args([str(config["out"])])
    options = {**vars(defaults), **config, "out": Path(config["out"])}
    if options["resume_from"] is not None:
        options["resume_from"] = Path(options["resume_from"])
    train(argparse.Namespace(**options))


def report(accelerator: Accelerator, state: Path, metrics: dict[str, Any]) -> None:
    """Report an epoch to Ray Train: metrics from every rank, the checkpoint from rank 0.

    The state folder is on storage every node sees; rank 0 hands Ray the whole folder, which
    Ray copies into the run's storage as this epoch's checkpoint.
    """
    import ray.train

    checkpoint = None
    if accelerator.is_main_process:
        checkpoint = ray.train.Checkpoint.from_directory(str(state))
    ray.train.report(metrics, checkpoint=checkpoint)


def train(args: argparse.Namespace) -> None:
    """Train, evaluate and save as the module docstring says."""
    if args.fail_on_host and socket.gethostname() == args.fail_on_host:
        raise RuntimeError(f"{args.fail_on_host} fails before the process group forms")
    slow = args.slow_seconds if socket.gethostname() == args.slow_host else 0.0

    accelerator = Accelerator()
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    training = DataLoader(data(args.samples, 1), batch_size=4, shuffle=True)
    evaluation = DataLoader(data(37, 2), batch_size=4)  # 37: the last batch is uneven
    model, optimizer, training, evaluation = accelerator.prepare(
        model, optimizer, training, evaluation
    )
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    state = args.out / "state"
    if state.exists():
        accelerator.load_state(str(state))
    elif args.resume_from is not None:
        accelerator.load_state(str(args.resume_from))
    where = {
        "hostname": socket.gethostname(),
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
        "device": str(accelerator.device),
        "ACCELERATE_TORCH_DEVICE": os.environ.get("ACCELERATE_TORCH_DEVICE"),
    }
    (args.out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(where))
    history = []
    steps_file = args.out / f"steps-{accelerator.process_index}"
    for epoch in range(progress.epochs_done, args.epochs):
        model.train()
        training.set_epoch(epoch)
        for inputs, targets in training:
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
        if args.ray:
            report(accelerator, state, history[-1])
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
    train(parser().parse_args())
