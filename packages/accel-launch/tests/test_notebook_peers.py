"""notebook_launcher: a worker waiting to start the process group for a peer that left ends at once.

Accelerate's test_notebook.py (``test_fault_tolerant``) hangs without this: the restarted worker
that takes the last item makes a PartialState, whose gloo group waits for the peer that already
returned (on Accelerate 1.15 too, on a CPU).
"""

import sys
import time

from launch_helpers import clean_env, run

CODE = """
import os, sys
from accel_launch import notebook_launcher

def only_rank_zero_starts_the_group(marks):
    from accel_state import PartialState
    if os.environ["RANK"] == "0" and os.environ["TORCHELASTIC_RESTART_COUNT"] == marks:
        print("rank 0 got", PartialState().num_processes, "processes", flush=True)

try:
    notebook_launcher(only_rank_zero_starts_the_group, args=(sys.argv[1],), num_processes=2,
                      max_restarts=int(sys.argv[2]))
    print("SUCCEEDED")
except Exception as error:
    print("FAILED", type(error).__name__)
"""


def test_a_worker_waiting_for_a_departed_peer_fails_the_round_at_once():
    start = time.monotonic()
    result = run(
        [sys.executable, "-c", CODE, "0", "0"], env=clean_env(CUDA_VISIBLE_DEVICES=""), timeout=120
    )
    assert "FAILED NotebookJobFailedError" in result.stdout, result.stdout + result.stderr
    assert "rank 0 is starting the process group, but rank(s) 1 already left" in result.stderr
    assert time.monotonic() - start < 100  # the group timeout is 30 minutes


def test_the_restarted_round_runs_when_no_worker_waits():
    # Round 0: rank 0 waits for rank 1, which returned -> that round fails; round 1 succeeds.
    result = run(
        [sys.executable, "-c", CODE, "0", "1"], env=clean_env(CUDA_VISIBLE_DEVICES=""), timeout=120
    )
    assert "SUCCEEDED" in result.stdout, result.stdout + result.stderr
    assert result.stderr.count("already left the function") == 1
