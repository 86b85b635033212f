"""One process on one machine: run the target as a child with the accel settings in its environment.

No torchrun variables are set, so the script behaves as ``python script.py`` would. As with POSIX
``system()``, the launcher ignores SIGINT while the child runs (Ctrl-C reaches the child directly,
being in the same foreground process group) and passes SIGTERM and SIGHUP on to it. The launcher
exits with the child's code (``128 + signal`` when the child died from a signal), except after a
SIGTERM (preemption): then with :data:`accel_state.contract.REQUEUE_EXIT_CODE` (75), asking the
scheduler to requeue the job, whatever the child did (saved and returned, or died).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import FrameType

from accel_launch.affinity import CPU_AFFINITY_ENV
from accel_launch.plan import LaunchPlan
from accel_launch.runners.guard import guarded
from accel_state.contract import REQUEUE_EXIT_CODE

_FORWARDED = ("SIGTERM", "SIGHUP")


def run_single(plan: LaunchPlan) -> int:
    """Run the target once and return its exit code."""
    children: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []
    received: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if not children:
            pending.append(signum)
        elif children[0].poll() is None:
            children[0].send_signal(signum)

    def ignore(signum: int, frame: FrameType | None) -> None:
        """Not SIG_IGN: an ignored SIGINT would be inherited by the child through exec."""

    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, ignore)
        for name in _FORWARDED:
            number = getattr(signal, name, None)
            if number is not None:
                previous[number] = signal.signal(number, forward)
    try:
        try:
            children.append(
                subprocess.Popen(
                    # --enable_cpu_affinity: the worker wrapper pins the process before the script.
                    guarded(plan.python_command(record_failures=CPU_AFFINITY_ENV in plan.env)),
                    env={**os.environ, **plan.env},
                )
            )
        except OSError as error:
            print(f"accel launch: cannot start {plan.target!r}: {error.strerror}", file=sys.stderr)
            return 127
        for signum in pending:
            children[0].send_signal(signum)
        code = children[0].wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
    if signal.SIGTERM in received:
        print(
            f"accel launch: got SIGTERM (preemption) and passed it on; exiting with "
            f"{REQUEUE_EXIT_CODE} so the scheduler requeues the job.",
            file=sys.stderr,
            flush=True,
        )
        return REQUEUE_EXIT_CODE
    return 128 - code if code < 0 else code
