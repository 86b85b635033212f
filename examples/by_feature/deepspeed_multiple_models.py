"""Two models trained at once under two DeepSpeed configs: ZeRO-2 and ZeRO-3, one Accelerator each.

    accel launch --cpu --num_processes 2 examples/by_feature/deepspeed_multiple_models.py
    accel launch --cpu --num_processes 2 examples/by_feature/deepspeed_multiple_models.py --resume

The first Accelerator gets every plugin; a second ``Accelerator()`` shares them, and the plugin
selected when it prepares its model decides that engine's config. Each Accelerator's
``backward`` drives its own engine (``accelerator.deepspeed_engine_wrapped``). The run trains
both models with gradient accumulation, evaluates them under ``no_grad`` after each epoch and
saves both states; ``--resume`` loads them and evaluates again. Needs
``pip install 'accel[deepspeed]'`` (on CPU set ``DS_ACCELERATOR=cpu``).
"""

import argparse
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DeepSpeedPlugin

BATCH, ACCUMULATION, EPOCHS = 16, 2, 2


def classifier(seed: int) -> torch.nn.Module:
    """A small two-class network."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


def datasets() -> tuple[TensorDataset, TensorDataset]:
    """Points labelled by the sign of ``x0 + x1``: 1024 to train on, 256 to evaluate."""
    inputs = torch.randn(1280, 8, generator=torch.Generator().manual_seed(0))
    labels = (inputs[:, 0] + inputs[:, 1] > 0).long()
    return TensorDataset(inputs[:1024], labels[:1024]), TensorDataset(inputs[1024:], labels[1024:])


def accuracy(accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader) -> float:
    """The model's accuracy over the whole evaluation set (every process's share gathered)."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for inputs, labels in loader:
            predictions = model(inputs).argmax(dim=-1)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == labels).sum())
            total += labels.numel()
    model.train()
    return correct / total


def main() -> None:
    """Train, evaluate and save both models (or, with ``--resume``, load and evaluate)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="two_models", help="where both states go")
    parser.add_argument("--resume", action="store_true", help="load the saved states instead")
    args = parser.parse_args()

    plugins = {
        "zero2": DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=ACCUMULATION),
        "zero3": DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=ACCUMULATION),
    }
    zero2 = Accelerator(deepspeed_plugins=plugins)
    zero3 = Accelerator()  # shares the state and its plugins; "zero2" is selected

    train_set, eval_set = datasets()
    train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True)
    eval_loader = DataLoader(eval_set, batch_size=BATCH)
    steps = EPOCHS * len(train_loader) // ACCUMULATION
    model_a = classifier(1)
    optimizer_a = torch.optim.AdamW(model_a.parameters(), lr=1e-2)
    scheduler_a = torch.optim.lr_scheduler.LinearLR(optimizer_a, 1.0, 0.1, total_iters=steps)
    model_a, optimizer_a, scheduler_a, train_loader, eval_loader = zero2.prepare(
        model_a, optimizer_a, scheduler_a, train_loader, eval_loader
    )

    zero3.state.select_deepspeed_plugin("zero3")
    # This prepare call has no dataloader: give the engine the other one's micro batch.
    plugins["zero3"].deepspeed_config["train_micro_batch_size_per_gpu"] = plugins[
        "zero2"
    ].deepspeed_config["train_micro_batch_size_per_gpu"]
    model_b = classifier(2)
    optimizer_b = torch.optim.AdamW(model_b.parameters(), lr=1e-2)
    scheduler_b = torch.optim.lr_scheduler.LinearLR(optimizer_b, 1.0, 0.1, total_iters=steps)
    model_b, optimizer_b, scheduler_b = zero3.prepare(model_b, optimizer_b, scheduler_b)
    zero2.state.select_deepspeed_plugin("zero2")
    zero2.print(
        "engines: zero stages",
        zero2.deepspeed_engine_wrapped.engine.zero_optimization_stage(),
        zero3.deepspeed_engine_wrapped.engine.zero_optimization_stage(),
    )

    folders = Path(args.output_dir) / "zero2", Path(args.output_dir) / "zero3"
    if args.resume:
        zero2.load_state(folders[0])
        zero3.load_state(folders[1])
        zero2.print(
            f"resumed: accuracy zero2 {accuracy(zero2, model_a, eval_loader):.3f} "
            f"zero3 {accuracy(zero2, model_b, eval_loader):.3f}"
        )
        zero2.end_training()
        return

    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        for inputs, labels in train_loader:
            # One accumulation context for both: they step together every 2 batches.
            with zero2.accumulate(model_a, model_b):
                for accelerator, model, optimizer, scheduler in (
                    (zero2, model_a, optimizer_a, scheduler_a),
                    (zero3, model_b, optimizer_b, scheduler_b),
                ):
                    accelerator.backward(loss_fn(model(inputs), labels))
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
        zero2.print(
            f"epoch {epoch}: accuracy zero2 {accuracy(zero2, model_a, eval_loader):.3f} "
            f"zero3 {accuracy(zero2, model_b, eval_loader):.3f}"
        )
    zero2.save_state(folders[0])
    zero3.save_state(folders[1])
    zero2.print(f"saved both states under {args.output_dir}")
    zero2.end_training()


if __name__ == "__main__":
    main()
