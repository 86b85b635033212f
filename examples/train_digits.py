"""Train a small classifier on scikit-learn's bundled 8x8 digit images with accel.

Nothing is downloaded: the 1,797 images ship inside scikit-learn. The script is a plain PyTorch
loop with the four changes accel asks for (create an Accelerator, drop ``.to(device)``, pass
everything to ``prepare``, call ``accelerator.backward``), plus distributed evaluation with
``gather_for_metrics``, a progress bar on the main process, a checkpoint each epoch and
``--resume``.

Run it on 2 CPU processes:

    accel launch --cpu --num_processes 2 examples/train_digits.py

or on one process with ``python examples/train_digits.py``. ``--batch_size`` is the total batch:
``split_batches=True`` divides it among the processes, so 1, 2 or 3 processes train the same
model and report the same accuracy (up to floating-point summation order).
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed, tqdm


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Digits classifier trained with accel.")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=48, help="total batch across processes")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--project_dir", default="runs/digits")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    return parser.parse_args()


def digits_datasets(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Scale the pixel values to [0, 1] and hold out 20% of the images for evaluation."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, kernel_size=3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, kernel_size=3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 2 * 2, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def evaluate(accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader) -> float:
    """Accuracy over the whole test set, each process scoring its share."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            predictions = model(images).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            total += len(labels)
    return correct / total


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    accelerator = Accelerator(
        split_batches=True,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    train_set, test_set = digits_datasets(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=args.batch_size)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train_loader, test_loader = accelerator.prepare(
        model, optimizer, train_loader, test_loader
    )
    # After prepare: the dataloader length is per process.
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * len(train_loader)
    )
    scheduler = accelerator.prepare(scheduler)

    first_epoch = 0
    if args.resume:
        accelerator.load_state()  # the newest complete checkpoint under project_dir/checkpoints
        first_epoch = accelerator.project_configuration.iteration
        accelerator.print(f"resumed after epoch {first_epoch}")

    for epoch in range(first_epoch, args.epochs):
        model.train()
        progress = tqdm(train_loader, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False)
        for images, labels in progress:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress.set_postfix(loss=f"{loss.item():.3f}")
        accuracy = evaluate(accelerator, model, test_loader)
        accelerator.print(f"epoch {epoch + 1}: test accuracy {accuracy:.4f}")
        accelerator.save_state()  # checkpoint_<epoch>: one per epoch, the last two kept

    accelerator.print(
        f"final test accuracy {accuracy:.4f} on {accelerator.num_processes} process(es)"
        if args.epochs > first_epoch
        else "nothing left to train"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
