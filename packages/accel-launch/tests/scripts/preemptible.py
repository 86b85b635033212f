"""On SIGTERM, "save" (write a file) and exit normally, as a script reading should_stop does."""

import os
import signal
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ.get("RANK", "0")
stopping = []
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
(out / f"{rank}.pid").write_text(str(os.getpid()))
deadline = time.monotonic() + 120
while not stopping and time.monotonic() < deadline:
    time.sleep(0.05)
(out / f"saved{rank}").write_text("saved after SIGTERM" if stopping else "never stopped")
