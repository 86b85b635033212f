"""The quick tour on 2 processes from a plain ``pip install accel``: train, evaluate, save, resume."""

import sys

import torch

from accel import Accelerator
from accel.utils import gather_object, set_seed


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), loader


def train(accelerator: Accelerator, model, optimizer, loader) -> list[float]:
    losses = []
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    folder = sys.argv[1]
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, optimizer, loader = accelerator.prepare(*build())
    train(accelerator, model, optimizer, loader)
    accelerator.save_state(folder)
    expected = train(accelerator, model, optimizer, loader)

    accelerator.load_state(folder)
    resumed = train(accelerator, model, optimizer, loader)
    if resumed != expected:
        raise SystemExit(f"resumed losses {resumed} differ from {expected}")

    predictions = accelerator.gather_for_metrics(torch.arange(3) + 3 * accelerator.process_index)
    if predictions.tolist() != list(range(3 * accelerator.num_processes)):
        raise SystemExit(f"gather_for_metrics gave {predictions.tolist()}")
    names = gather_object([f"rank{accelerator.process_index}"])
    if names != [f"rank{rank}" for rank in range(accelerator.num_processes)]:
        raise SystemExit(f"gather_object gave {names}")
    accelerator.wait_for_everyone()
    accelerator.print(f"whole API ok on {accelerator.num_processes} processes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: accel launch ... whole_api.py CHECKPOINT_FOLDER")
    main()
