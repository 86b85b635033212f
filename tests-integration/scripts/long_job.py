"""The fault-tolerance example, with test hooks: ``long_job.py [--die_at_step N] [--step_delay S] ARGS``.

``--requeue_exit``: leave with status 75 when stopped by SIGTERM, as a script run without
``accel launch`` (``srun --ntasks=2 python ...``) does so that SLURM requeues the job.
``--die_at_step N``: on the first attempt only (``restart_count == 0``), rank 1 kills itself with
SIGKILL right after optimizer step N, as an out-of-memory kill would (once the first checkpoint
is published: with ``--background_saves`` it may still be being written). ``--step_delay S`` sleeps S
seconds after every step, so that a signal sent by a test lands mid-training. The other arguments
go to the example unchanged.
"""

import argparse
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "by_feature" / "fault_tolerance.py"
spec = importlib.util.spec_from_file_location("fault_tolerance", EXAMPLE)
assert spec is not None and spec.loader is not None
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

parser = argparse.ArgumentParser()
parser.add_argument("--die_at_step", type=int, default=0)
parser.add_argument("--step_delay", type=float, default=0.0)
parser.add_argument("--requeue_exit", action="store_true")
hooks, rest = parser.parse_known_args()


attempt_started: list[int] = []


def on_step(accelerator, step: int) -> None:
    if not attempt_started:  # the first step of this attempt: say who and where
        attempt_started.append(step)
        print(
            f"WORLD rank {accelerator.process_index} of {accelerator.num_processes} "
            f"({accelerator.distributed_type.value}), restart_count {accelerator.restart_count}",
            flush=True,
        )
    first_attempt = accelerator.restart_count == 0
    if step == hooks.die_at_step and first_attempt and accelerator.process_index == 1:
        first = Path(arguments.project_dir) / "checkpoints" / "checkpoint_0"
        deadline = time.monotonic() + 300  # for a hang, never for speed
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    if hooks.step_delay:
        time.sleep(hooks.step_delay)


arguments = example.parse_args(rest)
finished = example.train(arguments, on_step)
sys.stdout.write(f"FINISHED {finished}\n")
if hooks.requeue_exit and not finished:
    from accel_state.contract import REQUEUE_EXIT_CODE

    sys.exit(REQUEUE_EXIT_CODE)
