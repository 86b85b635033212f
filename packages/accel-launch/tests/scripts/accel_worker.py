"""A script using accel-state: joins the group through PartialState and reports its contract."""

import json
import os
import sys

import torch
import torch.distributed as dist

from accel_state.partial_state import PartialState
from accel_state.shared import reset_state

out_dir = sys.argv[1]
state = PartialState()
value = torch.tensor([float(state.process_index)])
if state.use_distributed:
    dist.all_reduce(value)
record = {
    "rank": state.process_index,
    "world": state.num_processes,
    "rank_sum": value.item(),
    "mixed_precision": str(state.contract.mixed_precision),
    "accumulation": state.contract.gradient_accumulation_steps,
    "use_cpu": state.contract.use_cpu,
    "argv": sys.argv[2:],
}
with open(os.path.join(out_dir, f"rank{state.process_index}.json"), "w") as handle:
    json.dump(record, handle)
reset_state()
