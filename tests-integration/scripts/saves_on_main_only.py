"""The classic mistake: ``save_state`` under ``if accelerator.is_main_process:``."""

import sys

import torch

from accel import Accelerator
from accel.utils import ProjectConfiguration

accelerator = Accelerator(
    project_config=ProjectConfiguration(sys.argv[1], automatic_checkpoint_naming=True)
)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(6):
    accelerator.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    optimizer.zero_grad()
    if step == 2 and accelerator.is_main_process:
        accelerator.save_state()  # saves on rank 0 only
