"""What this process last entered: a small ring of collective records, for hang reports.

Every public collective of accel-ops, and what other packages wrap with :func:`record`
(``save_state``, ``backward``, ``wait_for_everyone``...), notes on entry its name, a sequence
number of this process, the shape and dtype of its operand where that is cheap to know, and the
caller's file and line: the first frame outside the packages registered with
:func:`register_internal_package` (accel's own). On return the record is marked done. Nothing is
formatted until a report is asked for, so a record costs a small object and a walk over a few
frames (``benchmarks/bench_collective_record.py`` measures it against a bare
``torch.distributed`` call).

A collective entered while another is in progress on the same thread (``gather_object`` inside
``save_state``) is not recorded separately: it is part of the outer one, whose ``phase``
(:func:`annotate`) says which step it is in.

:func:`describe_position` answers "where is this process": ``waits in gather #57 (train.py:42)``
while a collective is in progress (or failed waiting), else ``last entered all_reduce #56
(train.py:40)``. It is registered with :mod:`accel_state.failures`, so ``accel launch``'s failure
recorder writes it into torch elastic's error file and the launcher can put the ranks side by side.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any, TypeVar

import torch

from accel_ops.collective_errors import explain, is_distributed_error
from accel_state.failures import register_reporter, register_translator
from accel_state.shared import on_reset

F = TypeVar("F", bound=Callable[..., Any])

#: Records kept per process; older ones are overwritten.
RING_SIZE = 32

ENTERED, DONE, TIMED_OUT, FAILED = "entered", "done", "timed out", "failed"


class CollectiveRecord:
    """One collective this process entered (a slot of the ring, reused when the ring wraps).

    Attributes:
        seq: This process's sequence number (1, 2, ...), over every recorded operation; 0 for
            a slot never used.
        op: Operation name, e.g. ``"gather"`` or ``"save_state"``.
        shape: The operand's shape when it is a tensor (else None).
        dtype: The operand's dtype when it is a tensor (else None).
        kind: A short description of a non-tensor operand (a type name), else None.
        code: The code object of the caller's frame (None when unknown).
        offset: The caller's bytecode offset in ``code``; :attr:`lineno` is worked out from it
            only when a report asks (a frame's line number costs more than the whole record).
        started: ``time.monotonic()`` at entry.
        state: ``"entered"``, ``"done"``, ``"timed out"`` or ``"failed"``.
        phase: What an operation made of several steps was doing (set by :func:`annotate`).
    """

    __slots__ = (
        "code",
        "dtype",
        "kind",
        "offset",
        "op",
        "phase",
        "seq",
        "shape",
        "started",
        "state",
    )

    def __init__(self) -> None:
        self.seq = 0
        self.op = ""
        self.shape: torch.Size | None = None
        self.dtype: torch.dtype | None = None
        self.kind: str | None = None
        self.code: CodeType | None = None
        self.offset = 0
        self.started = 0.0
        self.state = DONE
        self.phase = ""

    @property
    def filename(self) -> str:
        """The caller's file."""
        return "<unknown>" if self.code is None else self.code.co_filename

    @property
    def lineno(self) -> int:
        """The caller's line."""
        if self.code is None:
            return 0
        for start, end, line in self.code.co_lines():
            if start <= self.offset < end and line is not None:
                return line
        return self.code.co_firstlineno

    @property
    def site_key(self) -> tuple[CodeType | None, int]:
        """The caller's ``(code, offset)``, to record later work at the same line."""
        return self.code, self.offset

    @property
    def site(self) -> str:
        """``train.py:42``: the caller's file name (without folders) and line."""
        return f"{os.path.basename(self.filename)}:{self.lineno}"

    @property
    def waiting(self) -> bool:
        """Whether the process is (or was, when it failed) waiting inside this collective."""
        return self.state in (ENTERED, TIMED_OUT)

    @property
    def operand(self) -> str:
        """``float32[4, 3]`` for a tensor, a type name for anything else, ``""`` for nothing."""
        if self.shape is not None and self.dtype is not None:
            return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"
        return self.kind or ""

    def mark_failed(self) -> None:
        """The collective raised (a timeout report refines this with :meth:`mark_timed_out`)."""
        self.state = FAILED

    def mark_timed_out(self) -> None:
        """The collective timed out waiting for the other processes."""
        self.state = TIMED_OUT

    def describe(self) -> str:
        """``gather #57 (train.py:42, float32[4])``, with the phase when known."""
        details = [self.site]
        if self.operand:
            details.append(self.operand)
        if self.phase:
            details.append(self.phase)
        return f"{self.op} #{self.seq} ({', '.join(details)})"

    def __repr__(self) -> str:
        return f"<CollectiveRecord {self.describe()} {self.state}>"


def _kind(value: Any) -> str | None:
    """A short description of a non-tensor operand (a list of tensors is described by its first)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        first = value[0]
        dtype = str(first.dtype).removeprefix("torch.")
        return f"{type(value).__name__} of {len(value)}, first {dtype}{list(first.shape)}"
    return type(value).__name__


class CollectiveRing:
    """The last :data:`RING_SIZE` records of this process (one instance: :data:`RING`).

    The slots are made once and overwritten in turn: a record writes a few fields of an object
    that already exists, which matters right after a large collective has pushed everything
    else out of the CPU caches.
    """

    def __init__(self, size: int = RING_SIZE) -> None:
        self.size = size
        self.slots = [CollectiveRecord() for _ in range(size)]
        self.counter = itertools.count(1)

    def add(self, op: str, operand: Any, frame: FrameType | None) -> CollectiveRecord:
        """Record entry into ``op``, called from ``frame`` (walked up to the user's code).

        ``operand`` is the tensor (or object) communicated; only cheap facts are kept.
        """
        while frame is not None and _is_internal(frame.f_code):
            frame = frame.f_back
        seq = next(self.counter)  # atomic under the GIL: threads never share a number
        entry = self.slots[seq % self.size]
        entry.seq, entry.op, entry.state, entry.phase = seq, op, ENTERED, ""
        entry.started = time.monotonic()
        if isinstance(operand, torch.Tensor) and operand.is_nested:
            # A nested tensor has no single shape (reading .shape raises): record its kind only.
            dtype = str(operand.dtype).removeprefix("torch.")
            entry.shape, entry.dtype, entry.kind = None, None, f"nested tensor of {dtype}"
        elif isinstance(operand, torch.Tensor):
            entry.shape, entry.dtype, entry.kind = operand.shape, operand.dtype, None
        else:
            entry.shape, entry.dtype, entry.kind = None, None, _kind(operand)
        if frame is None:
            entry.code, entry.offset = None, 0
        else:
            entry.code, entry.offset = frame.f_code, frame.f_lasti
        return entry

    def records(self) -> list[CollectiveRecord]:
        """The kept records, oldest first."""
        return sorted((entry for entry in self.slots if entry.seq), key=_seq)

    def clear(self) -> None:
        """Forget every record and restart numbering at 1."""
        self.slots = [CollectiveRecord() for _ in range(self.size)]
        self.counter = itertools.count(1)


def _seq(entry: CollectiveRecord) -> int:
    return entry.seq


class _PerThread(threading.local):
    current: CollectiveRecord | None = None  # the record in progress on this thread, if any
    inside: float = 0.0  # seconds this thread has spent in finished records, in all


RING = CollectiveRing()
_local = _PerThread()

# Files whose frames are skipped when looking for the caller: accel's packages and contextlib.
_internal_prefixes: tuple[str, ...] = ()
_internal_codes: dict[CodeType, bool] = {}


def register_internal_package(path: str) -> None:
    """Skip frames of files under ``path`` (a package folder) when finding the caller."""
    global _internal_prefixes
    folder = os.path.dirname(os.path.abspath(path)) if path.endswith(".py") else path
    prefix = os.path.join(os.path.abspath(folder), "")
    if prefix not in _internal_prefixes:
        _internal_prefixes = (*_internal_prefixes, prefix)
        _internal_codes.clear()


def _is_internal(code: CodeType) -> bool:
    known = _internal_codes.get(code)
    if known is None:
        filename = code.co_filename
        known = filename.startswith(_internal_prefixes) or filename == contextlib.__file__
        _internal_codes[code] = known
    return known


def current_record() -> CollectiveRecord | None:
    """The record in progress on this thread, if any."""
    return _local.current


def seconds_in_records() -> float:
    """Seconds this thread has spent inside recorded operations so far (finished ones).

    A clock of waiting: the time between two readings that went to collectives (and to other
    recorded operations, such as ``save_state``), which the slow-rank report takes out of a
    rank's own work.
    """
    return _local.inside


def _finish(entry: CollectiveRecord, seq: int, started: float) -> None:
    _local.current = None
    _local.inside += time.monotonic() - started
    if entry.seq == seq:  # the slot was not taken over meanwhile (ring wrapped)
        entry.state = DONE


def annotate(phase: str) -> None:
    """Say what the operation in progress on this thread is doing now (shown in reports)."""
    entry = _local.current
    if entry is not None:
        entry.phase = phase


def recorded(op: str, *, operand: bool = True) -> Callable[[F], F]:
    """Decorator: record each call of a collective as ``op``.

    Args:
        op: The name reports use.
        operand: Describe the first argument (a tensor's shape and dtype) in the record.

    Distributed failures inside are replaced by the errors of
    :mod:`accel_ops.collective_errors`, which name the operation and the caller's line.
    """

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _local.current is not None:
                return function(*args, **kwargs)  # inside another record: part of it
            entry = RING.add(op, args[0] if operand and args else None, sys._getframe(1))
            seq, started = entry.seq, entry.started
            _local.current = entry
            try:
                result = function(*args, **kwargs)
            except BaseException as error:  # noqa: BLE001 - re-raised, explained
                _local.current = None
                _raise_explained(error, entry)
            _finish(entry, seq, started)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def record(
    op: str, operand: Any = None, *, site: tuple[CodeType | None, int] | None = None
) -> Iterator[CollectiveRecord | None]:
    """Context manager: record the block as the collective ``op`` (see :func:`recorded`).

    Args:
        op: The name reports use.
        operand: The tensor (or object) the block communicates, described cheaply.
        site: The caller's ``(code, offset)`` to use instead of the stack's (a background thread
            finishing what the main thread started: :attr:`CollectiveRecord.site_key` of its
            record).

    Yields the record, or None when nested in another one (then the block is part of that one).
    """
    if _local.current is not None:
        yield None
        return
    entry = RING.add(op, operand, sys._getframe(2))
    seq, started = entry.seq, entry.started
    if site is not None:
        entry.code, entry.offset = site
    _local.current = entry
    try:
        yield entry
    except BaseException as error:  # noqa: BLE001 - re-raised, explained
        _local.current = None
        _raise_explained(error, entry)
    _finish(entry, seq, started)


def _raise_explained(error: BaseException, entry: CollectiveRecord) -> None:
    """Raise ``error``, or the clearer error :func:`explain` makes of it."""
    explained = explain(error, entry, records, describe_position)
    if explained is error:
        raise error
    raise explained from (None if entry.state == TIMED_OUT else error)


#: Where torch's own frames live: an unrecorded collective is named after the innermost of them.
_TORCH_FOLDER = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")
_GLOO_WAITED = re.compile(r"[Tt]imed out waiting (\d+) ?ms")


def explain_uncaught(error: BaseException) -> BaseException:
    """The explained form of a distributed error that ends this process outside any record.

    DDP's own collectives (its bucket rebuild in ``forward``, ``broadcast_buffers``), FSDP's and
    a script's raw ``torch.distributed`` calls raise gloo's plain text ("Timed out waiting
    60000ms for send operation"). The error is explained as a record's would be, with a record
    made from its traceback: the innermost torch function as the operation, the script's line
    as the caller. Anything else is returned as it is.
    """
    if not is_distributed_error(error) or _explained(error):
        return error
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    inside_torch = [tb for tb in frames if tb.tb_frame.f_code.co_filename.startswith(_TORCH_FOLDER)]
    callers = [
        tb
        for tb in frames
        if not tb.tb_frame.f_code.co_filename.startswith(_TORCH_FOLDER)
        and not _is_internal(tb.tb_frame.f_code)
    ]
    operation = inside_torch[-1].tb_frame.f_code if inside_torch else None
    name = f"torch {operation.co_qualname}" if operation is not None else "torch collective"
    entry = RING.add(name, None, None)  # kept, so the worker's position names it
    if callers:
        entry.code, entry.offset = callers[-1].tb_frame.f_code, callers[-1].tb_lasti
    waited = _GLOO_WAITED.search(str(error))
    entry.started = time.monotonic() - (int(waited.group(1)) / 1000 if waited else 0.0)
    entry.phase = "outside accel's collectives"
    explained = explain(error, entry, records, describe_position)
    if explained is not error:
        explained.__cause__ = None if entry.state == TIMED_OUT else error
        explained.__suppress_context__ = True
        explained.__traceback__ = error.__traceback__
    return explained


def _explained(error: BaseException) -> bool:
    """Whether ``error`` was raised from a record's explanation already (or is accel-ops' own)."""
    from accel_ops.errors import AccelOpsError

    return isinstance(error, AccelOpsError)


def records() -> list[CollectiveRecord]:
    """This process's recent records, oldest first."""
    return RING.records()


def position() -> CollectiveRecord | None:
    """The record that says where this process is: the newest one it waits in, else the newest."""
    kept = RING.records()
    waiting = [entry for entry in kept if entry.waiting]
    if waiting:
        return waiting[-1]
    return kept[-1] if kept else None


def describe_position() -> str:
    """``waits in gather #57 (train.py:42)``, ``last entered ...``, or ``""`` before any."""
    entry = position()
    if entry is None:
        return ""
    if entry.waiting:
        return f"waits in {entry.describe()}"
    if entry.state == FAILED:
        return f"failed in {entry.describe()}"
    return f"last entered {entry.describe()}"


@on_reset
def reset_records() -> None:
    """Forget every record of this process (also done by ``accel_state.reset_state()``)."""
    RING.clear()
    _local.current = None


register_internal_package(os.path.dirname(os.path.abspath(__file__)))
register_internal_package(
    os.path.dirname(os.path.abspath(sys.modules["accel_state"].__file__ or ""))
)
register_reporter("collectives", describe_position)
register_translator(explain_uncaught)
