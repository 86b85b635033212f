r"""Save the whole training state during training and resume it exactly, in a fresh launch.

``accelerator.save_state`` writes the model, optimizer, scheduler, RNG states and the position of
every prepared dataloader into one folder, atomically; ``accelerator.load_state`` reads it back.
With ``--checkpointing_steps N`` a checkpoint is written every N optimizer steps (``epoch``: at
the end of each epoch) under ``--output_dir``. ``--resume_from_checkpoint FOLDER`` resumes from
that folder, ``--resume_from_checkpoint latest`` from the newest one: the prepared loader skips
the batches already seen, so the resumed run continues mid-epoch where the saved one stood.

    accel launch --cpu --num_processes 2 examples/by_feature/checkpointing.py \
        --checkpointing_steps 5 --stop_after_step 12 --output_dir runs/ckpt
    accel launch --cpu --num_processes 2 examples/by_feature/checkpointing.py \
        --checkpointing_steps 5 --resume_from_checkpoint latest --output_dir runs/ckpt
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed


def digits(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's bundled 8x8 digits as 64 features in [0, 1]; 20% held out."""
    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return TensorDataset(features[train], labels[train]), TensorDataset(
        features[test], labels[test]
    )


class Progress:
    """The optimizer steps taken; registered, so save_state/load_state carry it."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:  # noqa: D102
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:  # noqa: D102
        self.step = int(state["step"])


def accuracy(accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for features, labels in loader:
            predictions = model(features).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            total += len(labels)
    model.train()
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument(
        "--checkpointing_steps", default="epoch", help="N optimizer steps, or 'epoch'"
    )
    parser.add_argument(
        "--resume_from_checkpoint", default=None, help="a checkpoint folder, or 'latest'"
    )
    parser.add_argument(
        "--stop_after_step", type=int, default=None, help="end early (to resume later)"
    )
    parser.add_argument("--output_dir", default="runs/checkpointing")
    args = parser.parse_args()

    set_seed(0)
    # automatic_checkpoint_naming: save_state() writes output_dir/checkpoints/checkpoint_<i>.
    project = ProjectConfiguration(
        project_dir=args.output_dir, automatic_checkpoint_naming=True, total_limit=3
    )
    accelerator = Accelerator(project_config=project)
    train_set, test_set = digits(seed=0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=64)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.8)
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler
    )
    every = None if args.checkpointing_steps == "epoch" else int(args.checkpointing_steps)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    if args.resume_from_checkpoint:
        folder = None if args.resume_from_checkpoint == "latest" else args.resume_from_checkpoint
        accelerator.load_state(folder)  # None: the newest complete checkpoint
        accelerator.print(f"resumed at step {progress.step}")

    first_epoch = progress.step // len(train_loader)
    for epoch in range(first_epoch, args.epochs):
        # The loader restored by load_state starts after the batches the saved run had seen.
        for features, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if every is not None and progress.step % every == 0:
                accelerator.save_state()
                accelerator.print(f"saved step {progress.step}")
            if args.stop_after_step is not None and progress.step >= args.stop_after_step:
                accelerator.print(f"stopping at step {progress.step}")
                accelerator.end_training()
                return
        if every is None:
            accelerator.save_state()
            accelerator.print(f"saved step {progress.step}")
        accelerator.print(
            f"epoch {epoch}: accuracy {accuracy(accelerator, model, test_loader):.4f}"
        )
    total = args.epochs * len(train_loader)
    accelerator.print(f"final step {progress.step} of {total}")
    accelerator.print(f"final accuracy {accuracy(accelerator, model, test_loader):.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
