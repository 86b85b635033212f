r"""Train with DeepSpeed ZeRO from a DeepSpeed config file, with "auto" values filled by accel.

Launch with ``--use_deepspeed --deepspeed_config_file FILE``: ``prepare`` builds one DeepSpeed
engine from the model, optimizer and scheduler. ``"auto"`` entries of the file are filled from
what the script and launcher say (micro-batch size from the prepared dataloader, accumulation
steps, clipping, precision). When the file defines the optimizer or the scheduler, the script
passes ``DummyOptim`` / ``DummyScheduler`` carrying their hyper-parameters instead of torch
objects, and the engine builds its own; otherwise torch's work as usual. On a CPU set
``DS_ACCELERATOR=cpu`` (DeepSpeed's CPU accelerator).

    DS_ACCELERATOR=cpu accel launch --cpu --num_processes 2 --use_deepspeed \
        --deepspeed_config_file examples/by_feature/deepspeed_config.json \
        --gradient_accumulation_steps 2 --gradient_clipping 1.0 \
        examples/by_feature/deepspeed_with_config_support.py
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import DummyOptim, DummyScheduler, set_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    set_seed(0)
    accelerator = Accelerator()  # DeepSpeed settings come from the launcher (or a DeepSpeedPlugin)
    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[:1400], order[1400:]
    train_loader = DataLoader(
        TensorDataset(features[train], labels[train]), batch_size=16, shuffle=True
    )
    test_loader = DataLoader(TensorDataset(features[test], labels[test]), batch_size=64)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    config = accelerator.state.deepspeed_plugin.config_file  # the file as written ("auto" in it)
    if "optimizer" in config:
        optimizer = DummyOptim(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = args.epochs * len(train_loader) // accelerator.gradient_accumulation_steps
    if "scheduler" in config:  # the engine builds it; these values fill its "auto" entries
        scheduler = DummyScheduler(optimizer, total_num_steps=steps, warmup_num_steps=steps // 10)
    else:
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=steps)
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler
    )
    for epoch in range(args.epochs):
        model.train()
        for batch, targets in train_loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(batch), targets)
                accelerator.backward(loss)  # the engine's backward; it steps on sync steps
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        model.eval()
        correct = count = 0
        with torch.no_grad():
            for batch, targets in test_loader:
                predictions, targets = accelerator.gather_for_metrics(
                    (model(batch).argmax(-1), targets)
                )
                correct += int((predictions == targets).sum())
                count += len(targets)
        accelerator.print(f"epoch {epoch}: test accuracy {correct / count:.4f}")
    resolved = accelerator.state.deepspeed_plugin.deepspeed_config
    accelerator.print(
        f"engine config: zero stage {resolved['zero_optimization']['stage']}, micro-batch "
        f"{resolved['train_micro_batch_size_per_gpu']}, accumulation "
        f"{resolved['gradient_accumulation_steps']}, train batch {resolved['train_batch_size']}, "
        f"clipping {resolved['gradient_clipping']}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
