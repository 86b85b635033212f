"""One training job for ``bench_ft.py``: a ~10 ms step, timed per step (benchmark helper).

``ft_job.py MODE STEPS OUT [KILL_AT]``. MODE ``raw``: hand-written DDP over the launcher's
process group; ``accel``: the Accelerator, DDP; ``ft``: the Accelerator in replica groups
(``accel launch --ft_replicas``). Rank 0 (of each group) writes ``OUT/<mode>-<replica>-<life>.json``:
seconds per step, and for a relaunched group how long its first step's quorum took (it heals
there). With KILL_AT, group 1 SIGKILLs itself at that step in its first life.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

mode, steps, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else -1
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
inputs, targets = torch.randn(64, 256), torch.randn(64, 256)
replica = int(os.environ.get("ACCEL_FT_REPLICA_ID", "0"))
life = int(os.environ.get("ACCEL_FT_GROUP_RESTART_COUNT", "0"))
heal_seconds: list[float] = []
if mode == "raw":
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(model)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()

else:
    from accel import Accelerator

    accelerator = Accelerator()
    rank = accelerator.process_index
    model, optimizer = accelerator.prepare(model, optimizer)
    if accelerator.replica_training is not None:
        manager = accelerator.replica_training.manager
        start_step = manager.start_step

        def timed_start() -> None:
            began = time.perf_counter()
            start_step()
            heal_seconds.append(time.perf_counter() - began)

        manager.start_step = timed_start  # type: ignore[method-assign]

    def step() -> None:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
        optimizer.step()


times: list[float] = []
for number in range(steps):
    if replica == 1 and life == 0 and number == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    began = time.perf_counter()
    step()
    times.append(time.perf_counter() - began)
if rank == 0:
    record = {"step_seconds": times, "first_quorum_seconds": heal_seconds[:1], "end": time.time()}
    (out / f"{mode}-{replica}-{life}.json").write_text(json.dumps(record))
