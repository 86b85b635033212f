"""Rank 1 fails on the first attempt only (a marker file remembers); then everyone succeeds."""

import os
import sys

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
marker = os.path.join(out_dir, "failed_once")
rank = int(os.environ["RANK"])
if rank == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
dist.init_process_group("gloo")
value = torch.tensor([1.0])
dist.all_reduce(value)
with open(os.path.join(out_dir, f"rank{rank}.done"), "w") as handle:
    handle.write(f"{value.item()} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')}")
dist.destroy_process_group()
