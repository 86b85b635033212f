"""Rank 1 raises; every other rank would sleep for two minutes if nobody stopped it."""

import os
import sys
import time

out_dir = sys.argv[1]
rank = int(os.environ["RANK"])
with open(os.path.join(out_dir, f"{rank}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
if rank == 1:
    time.sleep(0.5)
    raise RuntimeError("boom from rank 1")
time.sleep(120)
