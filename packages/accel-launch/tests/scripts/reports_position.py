"""Each rank says where it is through accel_state.failures, as accel-ops does for collectives.

Rank 1 writes its pid and sleeps; rank 0 waits for that, then raises. The launcher stops rank 1
with SIGTERM; both ranks' positions must reach the launcher's summary.
"""

import os
import sys
import time
from pathlib import Path

from accel_state.failures import register_reporter

out = Path(sys.argv[1])
rank = int(os.environ["RANK"])
register_reporter(
    "collectives", lambda: f"waits in fake_op #{10 + rank} (reports_position.py:{rank})"
)
if rank == 1:
    (out / "1.pid").write_text(str(os.getpid()))
    time.sleep(120)
deadline = time.monotonic() + 60
while not (out / "1.pid").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
raise RuntimeError("rank 0 gives up")
