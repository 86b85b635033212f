"""The everyday training script, run under ``accel launch`` with any strategy's flags.

Trains a small residual MLP classifier with dropout on generated data: a shuffled, prepared
loader, gradient accumulation, ``clip_grad_norm_`` when gradients sync, an LR scheduler, an
evaluation pass under ``torch.no_grad()`` with ``gather_for_metrics`` at each epoch end, then
``save_state()`` with automatic checkpoint naming and ``total_limit``, and finally ``save_model``.

Usage: ``everyday_script.py --project DIR --out REPORT.json [--epochs N] [--snapshot DIR]
[--resume]``. ``--snapshot DIR`` copies the project folder to ``DIR`` right after epoch 0's
checkpoint (what a job killed after epoch 0 would have left); ``--resume`` calls
``load_state()`` (the project's newest checkpoint) and trains the remaining epochs. Rank 0
writes the per-epoch evaluation losses and facts about the run to ``--out``.
"""

import argparse
import contextlib
import json
import shutil
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed

FEATURES, HIDDEN, CLASSES = 12, 32, 4
BATCH, ACCUMULATION, CLIP, LR, TOTAL_LIMIT = 4, 2, 1.0, 0.05, 2


class Block(torch.nn.Module):
    """A residual MLP block with dropout (the unit FSDP wraps)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


class Classifier(torch.nn.Module):
    """Input projection, two blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, HIDDEN)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def dataset(samples: int, seed: int) -> TensorDataset:
    """Four Gaussian classes in ``FEATURES`` dimensions, the same in every run."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(7))
    inputs = centers[labels] + 1.5 * torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, labels)


def evaluate(accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader) -> float:
    """Mean cross-entropy over exactly the evaluation set, gathered from every process."""
    model.eval()
    losses = []
    with torch.no_grad():
        for inputs, labels in loader:
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
            losses.append(accelerator.gather_for_metrics(loss))
    model.train()
    return torch.cat(losses).mean().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--snapshot", default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    config = ProjectConfiguration(
        project_dir=args.project, automatic_checkpoint_naming=True, total_limit=TOTAL_LIMIT
    )
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, project_config=config)
    set_seed(0)
    plugin = accelerator.state.deepspeed_plugin
    init = contextlib.nullcontext() if plugin is None else plugin.zero3_init_context_manager()
    with init:
        model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.1 * step))
    train_loader = DataLoader(dataset(96, seed=1), batch_size=BATCH, shuffle=True)
    # 30 samples: not a multiple of the global batch, so gather_for_metrics drops repeats.
    eval_loader = DataLoader(dataset(30, seed=2), batch_size=BATCH)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )

    first_epoch = 0
    if args.resume:
        accelerator.load_state()  # the project's newest complete checkpoint
        first_epoch = int(accelerator.save_iteration)
    eval_losses: dict[int, float] = {}
    norms: list[float] = []
    for epoch in range(first_epoch, args.epochs):
        for inputs, labels in train_loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(inputs).float(), labels)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        eval_losses[epoch] = evaluate(accelerator, model, eval_loader)
        accelerator.save_state()
        if epoch == 0 and args.snapshot is not None:
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                shutil.copytree(args.project, args.snapshot)
            accelerator.wait_for_everyone()
    model_dir = Path(args.project, "model")
    accelerator.save_model(model, model_dir)
    if accelerator.is_main_process:
        checkpoints = sorted(p.name for p in Path(args.project, "checkpoints").iterdir())
        report = {
            "distributed_type": accelerator.distributed_type.value,
            "num_processes": accelerator.num_processes,
            "first_epoch": first_epoch,
            "eval_losses": {str(epoch): loss for epoch, loss in eval_losses.items()},
            "clip_norms": norms,
            "lr": scheduler.get_last_lr()[0],
            "checkpoints": checkpoints,
            "model_dir": str(model_dir),
        }
        Path(args.out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
