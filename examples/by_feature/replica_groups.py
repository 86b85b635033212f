"""Training that does not stop for one failure: replica groups with per-step fault tolerance.

Run it as 2 replica groups of 2 CPU processes each (needs ``pip install 'accel[ft]'``):

    accel launch --cpu --ft_replicas 2 --num_processes 2 --max_restarts 3 \
        examples/by_feature/replica_groups.py

Each replica group is a job of its own (DDP inside it; ``--use_fsdp --fsdp_version 2`` shards
inside it instead); a lighthouse started by ``accel launch`` forms a quorum of the live groups at
every optimizer step, and the gradients are averaged across the groups of that quorum. Kill any
worker (``kill -9``) while it trains: its group is relaunched and the others go on, without
restarting; the relaunched group copies the live state (weights, optimizer, scheduler, data
position, RNG) from a live group and trains on beside them.

Nothing in the loop is specific to fault tolerance:

* ``optimizer.step()`` steps only if every group of the step's quorum finished it (the step is
  *committed*); otherwise ``accelerator.optimizer_step_was_skipped`` is True and the scheduler
  does not move either;
* the training dataloader hands out samples by the position the groups share: the samples of a
  step that was not committed come again, so every sample of an epoch is used in exactly one
  committed step, however many failures there were (printed at the end of each epoch);
* evaluation (the models in ``eval()`` mode) runs inside each group, ``gather_for_metrics``
  gathers inside it;
* ``save_state`` is written by one group only; resume a whole job with ``--resume``.

``accel launch --ft_lighthouse HOST:PORT --ft_replica_id I`` runs one group that joins a
lighthouse elsewhere (one launcher per machine).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed


class Regression(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """y = x @ w + noise, with each sample's index."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(count, 16, generator=generator)
        weights = 0.25 * torch.randn(16, 1, generator=torch.Generator().manual_seed(0))
        self.targets = self.inputs @ weights + 0.05 * torch.randn(count, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.inputs[index], self.targets[index], index


def main() -> None:
    """Train, evaluate and save each epoch; with ``--resume``, continue from the newest save."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--project_dir", default="replica_groups_run")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    set_seed(0)
    accelerator = Accelerator(
        project_config=ProjectConfiguration(args.project_dir, automatic_checkpoint_naming=True)
    )
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.8)
    train = DataLoader(Regression(512, 1), batch_size=8, shuffle=True)
    evaluation = DataLoader(Regression(128, 2), batch_size=32)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )
    starting_epoch = 0
    if args.resume:
        accelerator.load_state()
        starting_epoch = train.iteration  # the saved epoch (mid-epoch: its position too)

    for epoch in range(starting_epoch, args.epochs):
        model.train()
        committed = skipped = 0
        for inputs, targets, _ in train:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if accelerator.optimizer_step_was_skipped:
                skipped += 1
            else:
                committed += 1
        model.eval()
        errors = []
        for inputs, targets, _ in evaluation:
            with torch.no_grad():
                errors.append((model(inputs) - targets).pow(2))
        mse = accelerator.gather_for_metrics(torch.cat(errors)).mean().item()
        accelerator.print(
            f"epoch {epoch}: {committed} committed steps, {skipped} not committed, "
            f"eval mse {mse:.4f}"
        )
        accelerator.save_state()
    accelerator.print(f"final eval mse {mse:.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
