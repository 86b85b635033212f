"""A training loop on torchft directly, run by ``accel launch --ft_replicas`` (test helper).

``ft_replica_worker.py OUT STEPS KILL_AT WAIT_FOR_ALL``: each step starts a quorum, all-reduces
the gradients across the replica groups and commits or not. In its first life replica 1
SIGKILLs itself at its first step from KILL_AT on (-1: never) that every group takes part in, so
that the others hold the state it had reached (with WAIT_FOR_ALL 0: whoever takes part). It
trains until STEPS committed steps, and with WAIT_FOR_ALL 1 until a step in which every replica
group took part. Each process appends ``LIFE PID`` to ``OUT/pids-<replica>`` and ``LIFE STEP
COMMITTED PARTICIPANTS TIME`` per step to ``OUT/steps-<replica>``, and saves
``OUT/final-<replica>.pt`` at the end.
"""

import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

out, steps, kill_at, wait_for_all = Path(sys.argv[1]), *map(int, sys.argv[2:5])
replica = int(os.environ["ACCEL_FT_REPLICA_ID"])
life = int(os.environ["ACCEL_FT_GROUP_RESTART_COUNT"])
replicas = int(os.environ["ACCEL_FT_REPLICAS"])
with (out / f"pids-{replica}").open("a") as pids:
    pids.write(f"{life} {os.getpid()}\n")
# The group's own world; its store is the one torchft's Manager joins (MASTER_ADDR/PORT).
torch.distributed.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def load(state: dict) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


manager = Manager(
    pg=ProcessGroupGloo(timeout=timedelta(seconds=30)),
    load_state_dict=load,
    state_dict=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
    min_replica_size=int(os.environ["ACCEL_FT_MIN_REPLICAS"]),
    replica_id=f"replica_{replica}",
    timeout=timedelta(seconds=30),
    quorum_timeout=timedelta(seconds=120),
    use_async_quorum=False,
)
while True:
    optimizer.zero_grad()
    manager.start_quorum()
    step = manager.current_step()
    together = manager.num_participants() == replicas
    if replica == 1 and life == 0 and 0 <= kill_at <= step and (together or not wait_for_all):
        os.kill(os.getpid(), signal.SIGKILL)
    data = torch.Generator().manual_seed(step)
    inputs = torch.randn(16, 8, generator=data)
    targets = torch.randint(0, 3, (16,), generator=data)
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    for work in [manager.allreduce(parameter.grad) for parameter in model.parameters()]:
        work.wait()
    committed = manager.should_commit()
    if committed:
        optimizer.step()
    with (out / f"steps-{replica}").open("a") as record:
        record.write(f"{life} {step} {int(committed)} {manager.num_participants()} {time.time()}\n")
    everyone = manager.num_participants() == replicas
    if manager.current_step() >= steps and (everyone or not wait_for_all):
        break
    time.sleep(0.05)
final = {"model": model.state_dict(), "step": manager.current_step()}
torch.save(final, out / f"final-{replica}.pt")
manager.shutdown()
