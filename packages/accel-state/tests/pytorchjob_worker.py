"""``python pytorchjob_worker.py OUT``: what a Kubeflow PyTorchJob (v1) pod runs, no launcher.

The operator sets only ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``.
"""

import json
import sys

import torch
import torch.distributed as dist

from accel_state import PartialState

state = PartialState(cpu=True)
total = torch.tensor([float(state.process_index)])
dist.all_reduce(total)
record = {
    "num_processes": state.num_processes,
    "process_index": state.process_index,
    "distributed_type": state.distributed_type.value,
    "rank_sum": float(total.item()),
}
with open(f"{sys.argv[1]}/rank{state.process_index}.json", "w") as handle:
    json.dump(record, handle)
state.destroy_process_group()
