"""Run a worker's script and record when and why it failed: ``python _failure_recorder.py SCRIPT ARGS``.

The elastic agent learns that a worker failed only when it sees the process exit, to the second.
Which rank failed *first* is then a guess, and the peers of a failed rank fail too (their
connections close), often within the same second. This wrapper runs the script as ``python SCRIPT``
would (``__main__``, ``sys.argv``, ``sys.path[0]``), and when it raises writes torch elastic's error
file (``TORCHELASTIC_ERROR_FILE``) with the traceback and the exact time, then re-raises so the
traceback is printed and the exit code is what Python gives. ``-m MODULE`` runs a module instead.

It also writes where the worker's collectives were (``waits in gather #57 (train.py:42)``), when a
library in the worker registered that with ``accel_state.failures``, so the launcher can put the
ranks side by side. A worker the launcher stops with SIGTERM (because another one failed) is
recorded too: SIGTERM raises :class:`Terminated` in the script, unless the script handles
SIGTERM itself (``accelerator.should_stop`` does). It imports the standard library only (and,
with ``ACCELERATE_CPU_AFFINITY=1``, :mod:`accel_launch.affinity` to pin the worker first).
"""

import contextlib
import json
import os
import runpy
import signal
import sys
import time
import traceback
from types import FrameType, TracebackType

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
#: Key under torch's ``extraInfo`` holding the failure time with sub-second precision.
TIMESTAMP_KEY = "accel_timestamp"
#: Key under ``extraInfo`` holding where the worker's collectives were (the same string as
#: ``accel_state.contract.COLLECTIVES_KEY``; this file cannot import it).
COLLECTIVES_KEY = "accel_collectives"


#: After a collective timeout, how long a failed worker waits before exiting: the launcher stops
#: every other worker as soon as one exits, and the others, which timed out at about the same
#: moment, need that long to print their own error.
PEER_GRACE_SECONDS = 1.0


class Terminated(SystemExit):
    """The worker got SIGTERM: the launcher stops every worker once one fails (or on preemption)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name} (the launcher stops every worker once one fails)"


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _reports() -> dict[str, str]:
    """What libraries in this worker registered with ``accel_state.failures`` (if it was imported)."""
    failures = sys.modules.get("accel_state.failures")
    if failures is None:
        return {}
    try:
        return dict(failures.failure_reports())
    except Exception:  # noqa: BLE001 - never let a report hide the failure
        return {}


def record(error: BaseException, when: float) -> None:
    """Write torch elastic's error file for ``error`` unless the script already wrote one."""
    path = os.environ.get(ERROR_FILE)
    if not path or os.path.exists(path):  # a script decorated with torch's @record wrote it
        return
    frames = _script_frames(error)
    callstack = "".join(traceback.format_exception(type(error), error, frames))
    extra = {"py_callstack": callstack, "timestamp": str(int(when)), TIMESTAMP_KEY: repr(when)}
    collectives = _reports().get("collectives")
    if collectives:
        extra[COLLECTIVES_KEY] = collectives
    data = {"message": {"message": f"{type(error).__name__}: {error}", "extraInfo": extra}}
    try:
        with open(path, "w") as handle:
            json.dump(data, handle)
    except OSError:
        pass  # the traceback still reaches stderr; only the ordering hint is lost


def run(argv: list[str]) -> None:
    """Run ``argv`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) as ``python`` would run it."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    runpy.run_path(script, run_name="__main__")


def _linger() -> None:
    """Give peers that timed out in the same hang a moment to print their errors, then exit."""
    sys.stderr.flush()
    # A peer may exit first and the launcher stop this worker: it has reported already.
    with contextlib.suppress(Terminated):
        time.sleep(PEER_GRACE_SECONDS)


def _where(error: BaseException) -> str:
    """``train.py:42``: the innermost frame of the script's own folder where ``error`` was raised."""
    frames = traceback.extract_tb(error.__traceback__)
    home = os.path.join(os.path.realpath(sys.path[0] or os.getcwd()), "")
    mine = [frame for frame in frames if os.path.realpath(frame.filename).startswith(home)]
    candidates = mine or list(frames)
    if not candidates:
        return "?"
    return f"{os.path.basename(candidates[-1].filename)}:{candidates[-1].lineno}"


def _script_frames(error: BaseException) -> TracebackType | None:
    """The traceback of ``error`` from the script's first frame (without this file and runpy)."""
    tb = error.__traceback__
    ours = (os.path.realpath(__file__), os.path.realpath(runpy.__file__), "<frozen runpy>")
    while tb is not None and tb.tb_next is not None:
        name = tb.tb_frame.f_code.co_filename
        if name not in ours and os.path.realpath(name) not in ours:
            break
        tb = tb.tb_next
    return tb


def main() -> None:
    """Entry point: run the script, recording a failure before it propagates."""
    if hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
    if os.environ.get("ACCELERATE_CPU_AFFINITY", "").strip().lower() in ("1", "true", "yes"):
        # ``accel launch --enable_cpu_affinity``: pin this worker before the script starts threads.
        from accel_launch.affinity import apply_launch_affinity

        apply_launch_affinity()
    try:
        run(sys.argv[1:])
    except Terminated as stop:
        # Recorded, then gone as promptly as the signal would have made it: exit handlers could
        # wait on a collective whose peers are being stopped too.
        record(stop, time.time())
        sys.stderr.write(f"{stop} at {_where(stop)}\n")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(int(stop.code or 1))
    except SystemExit as stop:
        if stop.code not in (None, 0):
            record(stop, time.time())
        raise
    except Exception as error:  # noqa: BLE001 - recorded, reported like Python would, exit 1
        record(error, time.time())
        trimmed = error.with_traceback(_script_frames(error))  # Python prints __traceback__
        sys.excepthook(type(trimmed), trimmed, trimmed.__traceback__)
        if _reports().get("collectives", "").startswith("waits in"):
            _linger()
        sys.exit(1)
    except BaseException as error:  # KeyboardInterrupt and friends keep Python's own handling
        record(error, time.time())
        raise


if __name__ == "__main__":
    main()
