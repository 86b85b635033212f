"""Rank 1 skips one gather and goes on to the next reduce: a hang that must explain itself.

Prints ``ENTER <rank> <time>`` when each rank reaches the collective it will wait in.
"""

import sys
import time

import torch

from accel import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(4):
    loss = model(torch.ones(2, 4)).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if step == 2:
        sys.stdout.write(f"ENTER {accelerator.process_index} {time.time()!r}\n")
        sys.stdout.flush()
    if step == 2 and accelerator.process_index == 1:
        accelerator.reduce(loss.detach())  # rank 1: went on without the gather
    accelerator.gather(loss.detach())  # the gather
