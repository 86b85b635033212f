"""A torch script that knows nothing about accel: records what its launcher gave it."""

import json
import os
import sys

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
rank = int(os.environ.get("RANK", "0"))
total = None
if "WORLD_SIZE" in os.environ:
    dist.init_process_group("gloo")
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    total = value.item()
    dist.destroy_process_group()
names = [name for name in os.environ if name.startswith(("ACCEL_", "OMP_", "CUDA_VISIBLE"))]
record = {
    "argv": sys.argv[2:],
    "env": {name: os.environ[name] for name in names},
    "torchrun": {
        name: os.environ.get(name)
        for name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "GROUP_RANK",
        )
    },
    "rank_sum": total,
}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
    json.dump(record, handle)
sys.exit(int(os.environ.get("PLAIN_WORKER_EXIT", "0")))
