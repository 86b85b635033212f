"""Two DeepSpeed configs in one Accelerator: a student trains under ZeRO-2 against a ZeRO-3 teacher.

    accel launch --cpu --num_processes 2 examples/by_feature/deepspeed_multiple_plugins.py

Needs ``pip install 'accel[deepspeed]'`` (on CPU set ``DS_ACCELERATOR=cpu``).
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DeepSpeedPlugin


def mlp() -> torch.nn.Module:
    """A small regression network (teacher and student share the architecture)."""
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def main() -> None:
    """Distil a frozen teacher into a student for a few steps and print the loss."""
    plugins = {
        "training": DeepSpeedPlugin(zero_stage=2),
        "inference": DeepSpeedPlugin(zero_stage=3),
    }
    accelerator = Accelerator(deepspeed_plugin=plugins)
    torch.manual_seed(0)
    teacher, student = mlp(), mlp()
    loader = DataLoader(TensorDataset(torch.randn(256, 4)), batch_size=8)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)
    student, optimizer, loader = accelerator.prepare(student, optimizer, loader)

    accelerator.state.select_deepspeed_plugin("inference")
    teacher = accelerator.prepare(teacher)  # no optimizer: an inference engine under ZeRO-3
    teacher.eval()
    accelerator.state.select_deepspeed_plugin("training")

    for step, (inputs,) in enumerate(loader):
        with torch.no_grad():
            target = teacher(inputs)
        loss = torch.nn.functional.mse_loss(student(inputs), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 8 == 0:
            accelerator.print(f"step {step}: loss {accelerator.reduce(loss.detach(), 'mean'):.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
