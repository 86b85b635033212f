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
import threading
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


#: How long the main thread has to act on SIGTERM before the watchdog ends the worker itself.
#: Python runs a signal handler between two instructions of the main thread, so a worker blocked
#: in a C++ call (a rendezvous, or a collective whose peer died) never would, and torch elastic
#: waits 30 s before it sends SIGKILL (a restart, or the end of a failed job, waits that long).
TERMINATE_GRACE_SECONDS = 2.0

_terminated_handled = threading.Event()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    _terminated_handled.set()
    raise Terminated(signum)


def _watch_for_sigterm() -> None:
    """End the worker promptly on SIGTERM even while its main thread is blocked in C++.

    The C-level signal handler writes the signal number to a wakeup pipe whatever the main
    thread is doing; a daemon thread reads it. Nothing is armed when another library already
    owns the wakeup file descriptor (asyncio does, in its loop).
    """
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    try:
        previous = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        previous = None
    if previous != -1:
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(reader)
        os.close(writer)
        return
    watchdog = threading.Thread(
        target=_sigterm_watchdog, args=(reader,), name="accel-sigterm-watchdog", daemon=True
    )
    watchdog.start()


def _sigterm_watchdog(reader: int) -> None:
    while True:
        try:
            received = os.read(reader, 64)
        except OSError:
            return
        if not received:
            return
        if signal.SIGTERM not in received:
            continue
        # Only the recorder's own handler is backed up: a script (or accel's fault tolerance)
        # that installed its own SIGTERM handler decides itself how long stopping may take.
        if signal.getsignal(signal.SIGTERM) is not _raise_terminated:
            continue
        if _terminated_handled.wait(TERMINATE_GRACE_SECONDS):
            return
        _exit_blocked(Terminated(int(signal.SIGTERM)))


def _exit_blocked(stop: Terminated) -> None:
    """Record and report a SIGTERM the blocked main thread could not act on, then exit."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
    record(stop, time.time())
    where = _innermost_script_frame(list(stack))
    sys.stderr.write(
        f"{stop} while blocked at {where} (in a call that does not return to Python)\n"
        + "".join(stack.format()[-6:])
    )
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(int(stop.code or 1))


def _reports() -> dict[str, str]:
    """What libraries in this worker registered with ``accel_state.failures`` (if it was imported)."""
    failures = sys.modules.get("accel_state.failures")
    if failures is None:
        return {}
    try:
        return dict(failures.failure_reports())
    except Exception:  # noqa: BLE001 - never let a report hide the failure
        return {}


def _translated(error: BaseException) -> BaseException:
    """The error as the worker's libraries explain it (``accel_state.failures.translate``).

    A raw gloo timeout raised inside DDP, FSDP or the script's own ``torch.distributed`` call
    becomes accel-ops' explanation, naming the operation, the script's line and the silent
    ranks with their hosts.
    """
    failures = sys.modules.get("accel_state.failures")
    translate = getattr(failures, "translate", None)
    if translate is None:
        return error
    try:
        translated = translate(error)
    except Exception:  # noqa: BLE001 - never let a report hide the failure
        return error
    return translated if isinstance(translated, BaseException) else error


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
    return _innermost_script_frame(traceback.extract_tb(error.__traceback__))


def _innermost_script_frame(frames: list[traceback.FrameSummary]) -> str:
    """``train.py:42``: the innermost of ``frames`` in the script's own folder (else the last)."""
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
        _watch_for_sigterm()
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
    except Exception as raised:  # noqa: BLE001 - recorded, reported like Python would, exit 1
        error = _translated(raised)
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
