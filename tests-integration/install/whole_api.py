"""The quick tour on 2 processes from a plain ``pip install accel``: train, evaluate, save, resume."""

import sys

import torch

from accel import Accelerator, UnsupportedFeatureError
from accel.utils import gather_object, set_seed
from accel_state import reset_state


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


def check_low_precision_is_refused_without_its_extras() -> None:
    """fp8 and 8-bit loading need accel[fp8] / accel[bnb]: refused by name, never imported."""
    try:
        Accelerator(mixed_precision="fp8")
    except UnsupportedFeatureError as error:
        if "accel[fp8]" not in str(error):
            raise SystemExit(f"fp8 refusal does not name the extra: {error}") from None
    else:
        raise SystemExit("mixed_precision='fp8' without torchao was not refused")
    reset_state(stop_process_group=False)
    from accel.utils import BnbQuantizationConfig, load_and_quantize_model

    try:
        load_and_quantize_model(torch.nn.Linear(4, 4), BnbQuantizationConfig(load_in_8bit=True))
    except ValueError as error:
        if "accel-ckpt[bnb]" not in str(error):
            raise SystemExit(f"bitsandbytes refusal does not name the extra: {error}") from None
    else:
        raise SystemExit("8-bit loading without bitsandbytes was not refused")
    loaded = [name for name in ("torchao", "bitsandbytes", "deepspeed") if name in sys.modules]
    if loaded:
        raise SystemExit(f"optional packages were imported: {loaded}")


def main() -> None:
    folder = sys.argv[1]
    check_low_precision_is_refused_without_its_extras()
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
