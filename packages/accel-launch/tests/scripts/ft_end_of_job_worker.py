"""Replica groups meeting the end of a job (test helper; no training, the launcher's side).

``ft_end_of_job_worker.py OUT``: replica 1 fails at once in its first life; replica 0 waits
until replica 1's relaunch has started, then finishes (exit 0). The relaunch waits until the
file ``ACCEL_FT_JOB_FINISHED_FILE`` names exists, copies it to ``OUT/seen-finished``, then fails
with exit code 7: the launcher must not relaunch it again. Each life appends its number to
``OUT/lives-<replica>``.
"""

import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
replica = int(os.environ["ACCEL_FT_REPLICA_ID"])
life = int(os.environ["ACCEL_FT_GROUP_RESTART_COUNT"])
finished_file = Path(os.environ["ACCEL_FT_JOB_FINISHED_FILE"])
with (out / f"lives-{replica}").open("a") as lives:
    lives.write(f"{life}\n")


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"{path} did not appear within 120 s")
        time.sleep(0.05)


if replica == 0:
    wait_for(out / "relaunch-started")
    sys.exit(0)
if life == 0:
    sys.exit(1)
(out / "relaunch-started").touch()
wait_for(finished_file)
(out / "seen-finished").write_text(finished_file.read_text())
sys.exit(7)
