"""Write torch's Flight Recorder dump of a one-process gloo group to the file given (argv[1]).

The same trace buffer and pickle format torch writes for NCCL on a collective timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``); gloo records into it too since torch 2.8.
"""

import os
import sys

os.environ["TORCH_FR_BUFFER_SIZE"] = "20"

import torch
import torch.distributed as dist

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
tensor = torch.ones(4)
dist.all_reduce(tensor)
dist.all_gather([torch.zeros(4)], tensor)  # collective 2
dist.all_reduce(torch.ones(2, 3))  # collective 3
with open(sys.argv[1], "wb") as handle:
    handle.write(torch._C._distributed_c10d._dump_fr_trace())
dist.destroy_process_group()
