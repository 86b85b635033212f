"""A training job used by the kill-and-resume test: ``torchrun ... resume_script.py OUT [--kill-at N] [--resume]``.

It trains with shuffling, dropout, gradient accumulation and a scheduler, saves the whole state
after micro-steps 7 and 9 (automatic checkpoint naming; 7 is mid-epoch), and prints one
``LOSS <step> <value>`` line per micro-step on rank 0. ``--kill-at N`` SIGKILLs rank 0 right after
micro-step N; ``--resume`` loads the newest complete checkpoint first and continues.
"""

import argparse
import json
import os
import signal

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed

parser = argparse.ArgumentParser()
parser.add_argument("project_dir")
parser.add_argument("--kill-at", type=int, default=-1)
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

set_seed(7)
config = ProjectConfiguration(
    project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
)
accelerator = Accelerator(project_config=config, gradient_accumulation_steps=2)
generator = torch.Generator().manual_seed(0)
data = TensorDataset(
    torch.randn(40, 5, generator=generator), torch.randn(40, 1, generator=generator)
)
model = torch.nn.Sequential(
    torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.9)
loader = DataLoader(data, batch_size=4, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

micro_step, start_epoch = 0, 0
progress = {"micro_step": 0, "epoch": 0}


class Progress:
    def state_dict(self):
        return dict(progress)

    def load_state_dict(self, state):
        progress.update(state)


accelerator.register_for_checkpointing(Progress())
if args.resume:
    accelerator.load_state()
    micro_step, start_epoch = progress["micro_step"], progress["epoch"]

for epoch in range(start_epoch, 3):
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        micro_step += 1
        if accelerator.is_main_process:
            print(f"LOSS {micro_step} {loss.item()!r}", flush=True)
        if accelerator.sync_gradients and micro_step in (7, 9):
            progress.update(micro_step=micro_step, epoch=epoch)
            accelerator.save_state()
        if micro_step == args.kill_at and accelerator.is_main_process:
            os.kill(os.getpid(), signal.SIGKILL)
    progress.update(micro_step=micro_step, epoch=epoch + 1)

weights = [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
if accelerator.is_main_process:
    print("WEIGHTS " + json.dumps(weights), flush=True)
accelerator.end_training()
