"""A plain torch.distributed script (no accel import), as accel-launch runs any torch script."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
world = dist.get_world_size()
assert value.item() == world * (world + 1) / 2, value
assert os.environ["LOCAL_WORLD_SIZE"] == str(world)
if dist.get_rank() == 0:
    print(f"accel-launch ran a plain torch script on {world} processes")
dist.destroy_process_group()
