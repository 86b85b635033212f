"""Rank 1 stops answering at step 2; rank 0 times out in a collective accel did not make.

``python raw_timeout_script.py ddp|raw``: ``ddp`` waits in DDP's own bucket rebuild (in the
forward pass of step 2), ``raw`` in a plain ``torch.distributed.all_reduce`` of the script.
"""

import sys
import time

import torch
import torch.distributed as dist

from accel import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
for step in range(3):
    if step == 1 and accelerator.process_index == 1:
        time.sleep(120)  # stops answering (the launcher stops it once rank 0 failed)
    if step == 1 and sys.argv[1] == "raw":
        dist.all_reduce(torch.ones(1))
    accelerator.backward(model(torch.ones(2, 4)).sum())
