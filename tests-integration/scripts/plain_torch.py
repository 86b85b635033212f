"""A torch script that never imports accel: it sees torchrun's variables and all-reduces ranks."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
# One write per line: print() writes the newline separately, so concurrent ranks could interleave.
sys.stdout.write(
    f"PLAIN rank={os.environ['RANK']} world={dist.get_world_size()} sum={total.item():.0f}\n"
)
sys.stdout.flush()
dist.destroy_process_group()
