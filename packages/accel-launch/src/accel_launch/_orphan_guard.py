"""Run a worker so that it dies with its launcher: ``python -S _orphan_guard.py LAUNCHER_PID CMD...``.

PyTorch's elastic agent starts every worker in a session of its own, so a launcher killed with
SIGKILL (which cannot clean up) would leave its workers running. On Linux this script asks the
kernel to SIGKILL it when its parent dies, checks that the launcher is still that parent, then
replaces itself with the worker command; ``execvp`` keeps the parent-death signal. It runs
before anything else is imported, so it uses the standard library only.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    """Arm the parent-death signal and exec the command; return 1 if the launcher is gone."""
    launcher, command = int(argv[1]), argv[2:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != launcher:
            return 1
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
