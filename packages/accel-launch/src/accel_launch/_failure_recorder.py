"""Run a worker's script and record when and why it failed: ``python _failure_recorder.py SCRIPT ARGS``.

The elastic agent learns that a worker failed only when it sees the process exit, to the second.
Which rank failed *first* is then a guess, and the peers of a failed rank fail too (their
connections close), often within the same second. This wrapper runs the script as ``python SCRIPT``
would (``__main__``, ``sys.argv``, ``sys.path[0]``), and when it raises writes torch elastic's error
file (``TORCHELASTIC_ERROR_FILE``) with the traceback and the exact time, then re-raises so the
traceback is printed and the exit code is what Python gives. ``-m MODULE`` runs a module instead.
It imports the standard library only.
"""

import json
import os
import runpy
import sys
import time
import traceback
from types import TracebackType

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
#: Key under torch's ``extraInfo`` holding the failure time with sub-second precision.
TIMESTAMP_KEY = "accel_timestamp"


def record(error: BaseException, when: float) -> None:
    """Write torch elastic's error file for ``error`` unless the script already wrote one."""
    path = os.environ.get(ERROR_FILE)
    if not path or os.path.exists(path):  # a script decorated with torch's @record wrote it
        return
    frames = _script_frames(error)
    callstack = "".join(traceback.format_exception(type(error), error, frames))
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": str(int(when)),
                TIMESTAMP_KEY: repr(when),
            },
        }
    }
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
    try:
        run(sys.argv[1:])
    except SystemExit as stop:
        if stop.code not in (None, 0):
            record(stop, time.time())
        raise
    except Exception as error:  # noqa: BLE001 - recorded, reported like Python would, exit 1
        record(error, time.time())
        trimmed = error.with_traceback(_script_frames(error))  # Python prints __traceback__
        sys.excepthook(type(trimmed), trimmed, trimmed.__traceback__)
        sys.exit(1)
    except BaseException as error:  # KeyboardInterrupt and friends keep Python's own handling
        record(error, time.time())
        raise


if __name__ == "__main__":
    main()
