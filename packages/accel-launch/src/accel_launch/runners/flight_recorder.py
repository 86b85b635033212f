"""Where NCCL workers waited, from torch's Flight Recorder dumps.

An NCCL collective runs asynchronously: when it hangs, no Python code of the worker sees an
error; torch's watchdog aborts the process after the timeout. torch's Flight Recorder keeps the
last collectives of each process group and, with ``TORCH_NCCL_DUMP_ON_TIMEOUT``, writes them to
``<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`` first. For jobs on GPUs the launcher points that prefix
into its log folder (:func:`flight_recorder_env`) and, when the job fails, reads each rank's dump
into the same one-line form accel-ops gives for gloo: ``waits in nccl:all_gather #57 (train.py:42)``.

The dump is a pickle of plain lists, dicts, strings and numbers; it is read with an unpickler
that refuses anything else.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

from accel_state.contract import flight_recorder_env as _contract_env

FOLDER = "flight_recorder"
PREFIX = "rank_"
# Frames of these packages are skipped when looking for the user's line.
_INTERNAL = tuple(
    f"{os.sep}{name}{os.sep}"
    for name in (
        "torch",
        "deepspeed",
        "accel",
        "accel_state",
        "accel_ops",
        "accel_data",
        "accel_ckpt",
        "accel_launch",
    )
)


class _PlainUnpickler(pickle.Unpickler):
    """Builds only built-in containers and scalars; any class reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"flight recorder dump refers to {module}.{name}")


def flight_recorder_env(log_dir: str) -> dict[str, str]:
    """The variables that make NCCL workers dump their Flight Recorder into ``log_dir``."""
    folder = Path(log_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return _contract_env(str(folder / PREFIX))


def read_dump(path: Path) -> dict[str, Any] | None:
    """One rank's dump, or None when it is missing or unreadable."""
    try:
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
        return None
    return data if isinstance(data, dict) else None


def _site(frames: Any) -> str:
    """``train.py:42``: the first frame of the user's code in an entry's stack, if recorded."""
    if not isinstance(frames, list):
        return ""
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if filename and not any(part in filename for part in _INTERNAL):
            return f"{os.path.basename(filename)}:{frame.get('line', '?')}"
    return ""


def describe_dump(data: dict[str, Any]) -> str:
    """``waits in nccl:all_gather #57 (train.py:42, float32 [[4]])`` or ``last entered ...``."""
    entries = [entry for entry in data.get("entries", []) if isinstance(entry, dict)]
    if not entries:
        return ""
    # An entry is retired once its work finished; NCCL also marks it "completed".
    waiting = [
        entry for entry in entries if not entry.get("retired") and entry.get("state") != "completed"
    ]
    entry = waiting[0] if waiting else entries[-1]  # the oldest unfinished one blocks the rest
    details = [part for part in (_site(entry.get("frames")),) if part]
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if sizes:
        details.append(f"{','.join(map(str, dtypes or []))} {sizes}")
    name = entry.get("profiling_name", "collective")
    seq = entry.get("collective_seq_id", "?")
    where = f" ({', '.join(details)})" if details else ""
    verb = "waits in" if waiting else "last entered"
    return f"{verb} {name} #{seq}{where}"


def positions(log_dir: str) -> dict[int, str]:
    """Rank -> position line, for every rank that left a Flight Recorder dump in ``log_dir``."""
    folder = Path(log_dir) / FOLDER
    found: dict[int, str] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob(f"{PREFIX}*")):
        suffix = path.name.removeprefix(PREFIX)
        if not suffix.isdigit():
            continue
        data = read_dump(path)
        line = describe_dump(data) if data is not None else ""
        if line:
            found[int(suffix)] = line
    return found
