"""Writes its pid, then sleeps (stopped by signals in the tests)."""

import os
import sys
import time

out_dir = sys.argv[1]
with open(os.path.join(out_dir, f"{os.environ.get('RANK', '0')}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(120)
