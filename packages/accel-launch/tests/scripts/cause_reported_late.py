"""Rank 1 is the cause but exits last: it raises, then its exit closes the group and lingers.

Rank 0 sits in a barrier, sees its connection to rank 1 close and exits at once with a transport
error, while rank 1 is still shutting down; the agent sees rank 0 exit first. The launcher must
still name rank 1, which raised first.
"""

import atexit
import os
import time

import torch.distributed as dist


def slow_exit() -> None:
    """Close the connections (rank 0 fails now), then take a while to finish exiting."""
    dist.destroy_process_group()
    time.sleep(5)


dist.init_process_group("gloo")
if int(os.environ["RANK"]) == 1:
    atexit.register(slow_exit)
    raise RuntimeError("the real cause, on rank 1")
dist.barrier()
