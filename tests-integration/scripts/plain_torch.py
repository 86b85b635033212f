"""A torch script that never imports accel: it sees torchrun's variables and all-reduces ranks."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print(
    f"PLAIN rank={os.environ['RANK']} world={dist.get_world_size()} sum={total.item():.0f}",
    flush=True,
)
dist.destroy_process_group()
