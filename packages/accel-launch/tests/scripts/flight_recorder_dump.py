"""Write torch's Flight Recorder dump of a one-process gloo group to the file given (argv[1]).

The same trace buffer and pickle format torch writes for NCCL on a collective timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT``); gloo records into it too since torch 2.8.
"""

import os
import pickle
import sys
import time

os.environ["TORCH_FR_BUFFER_SIZE"] = "20"

import torch
import torch.distributed as dist

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
tensor = torch.ones(4)
dist.all_reduce(tensor)
dist.all_gather([torch.zeros(4)], tensor)  # collective 2
dist.all_reduce(torch.ones(2, 3))  # collective 3
# An entry is marked retired once torch sees its work finished, which may lag the call's return
# on a busy machine: dump once every finished collective says so (the test expects that state).
deadline = time.monotonic() + 60
while True:
    dump = torch._C._distributed_c10d._dump_fr_trace()
    entries = pickle.loads(dump).get("entries", [])
    if all(entry.get("retired") for entry in entries) or time.monotonic() > deadline:
        break
    time.sleep(0.05)
with open(sys.argv[1], "wb") as handle:
    handle.write(dump)
dist.destroy_process_group()
