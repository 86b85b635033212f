"""Debug mode: compare every process's operands before a collective and fail readably.

A collective whose operands differ across processes (shapes, dtypes, structure) hangs or returns
garbage. In debug mode each collective first all-gathers a description of every process's operands
and, when they disagree, raises :class:`DistributedOperationError` on every process, listing them.
Outside debug mode nothing extra is sent.

Debug mode is on when ``debug=True`` is passed to an operation, else when :func:`set_debug_mode`
turned it on, else when ``PartialState().debug`` says so (settable by scripts), else when the
launcher contract says so (``ACCEL_DEBUG_MODE=1`` or ``ACCELERATE_DEBUG_MODE=1``, read once through
``accel_state.LaunchContract``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import torch

from accel_ops.errors import DistributedOperationError
from accel_ops.group import GroupInfo
from accel_ops.structures import named_leaves
from accel_ops.transport import all_gather_objects
from accel_state import PartialState
from accel_state.contract import LaunchContract
from accel_state.shared import on_reset

_override: bool | None = None
_from_environment: bool | None = None

_MAX_LISTED_LEAVES = 8


def set_debug_mode(enabled: bool | None) -> None:
    """Turn debug mode on or off for this process; None goes back to ``ACCEL_DEBUG_MODE``.

    Passing None also forgets the cached environment reading, so a changed variable is seen.
    """
    global _override, _from_environment
    _override = enabled
    if enabled is None:
        _from_environment = None


@on_reset
def forget_debug_mode() -> None:
    """Drop the toggle and the cached environment reading (``accel_state.reset_state()`` does)."""
    set_debug_mode(None)


def is_debug_mode(debug: bool | None = None) -> bool:
    """Whether debug mode applies: ``debug`` if given, else the toggle, else the environment."""
    global _from_environment
    if debug is not None:
        return debug
    if _override is not None:
        return _override
    partial = PartialState._shared_state
    if "debug" in partial:
        return bool(partial["debug"])
    if _from_environment is None:
        _from_environment = LaunchContract.from_env().debug
    return _from_environment


class LeafRecord(NamedTuple):
    """A picklable description of one operand leaf."""

    path: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    device: str

    def render(self) -> str:
        """``data['key']: dtype[shape] on device`` (or the type name of a non-tensor leaf)."""
        where = f"data{self.path}"
        if self.kind != "tensor":
            return f"{where}: {self.kind}"
        return f"{where}: {self.dtype}{list(self.shape)} on {self.device}"


def describe(data: Any) -> list[LeafRecord]:
    """One :class:`LeafRecord` per leaf of ``data``, in traversal order."""
    records = []
    for path, leaf in named_leaves(data):
        if isinstance(leaf, torch.Tensor) and leaf.is_nested:
            records.append(LeafRecord(path, "nested tensor", (), "", leaf.device.type))
        elif isinstance(leaf, torch.Tensor):
            dtype = str(leaf.dtype).removeprefix("torch.")
            records.append(LeafRecord(path, "tensor", tuple(leaf.shape), dtype, leaf.device.type))
        else:
            records.append(LeafRecord(path, type(leaf).__qualname__, (), "", ""))
    return records


def exact_key(record: LeafRecord) -> Hashable:
    """Comparison key for collectives that need identical shapes and dtypes."""
    return record


def rank_key(record: LeafRecord) -> Hashable:
    """Comparison key for operations that need the same structure and number of dimensions."""
    return (record.path, record.kind, len(record.shape), record.device)


def check_operands(
    operation: str,
    data: Any,
    group: GroupInfo,
    debug: bool | None,
    key: Callable[[LeafRecord], Hashable] = exact_key,
    hint: str = "",
) -> None:
    """In debug mode, verify that every process passes matching operands to ``operation``.

    Does nothing (and sends nothing) outside debug mode.

    Raises:
        DistributedOperationError: On every process, when the operands disagree across processes
            or a tensor sits on a device the backend cannot move.

    """
    if debug is False or (debug is None and not is_debug_mode()):
        return
    check_records(operation, describe(data), group, key, hint)


def check_records(
    operation: str,
    records: list[LeafRecord],
    group: GroupInfo,
    key: Callable[[LeafRecord], Hashable] = exact_key,
    hint: str = "",
) -> None:
    """All-gather ``records`` and raise on every process when they disagree (see above)."""
    everyone: list[list[LeafRecord]] = all_gather_objects(records, group)
    keys = [[key(record) for record in records] for records in everyone]
    if any(process_keys != keys[0] for process_keys in keys[1:]):
        raise _mismatch_error(operation, everyone, keys, hint)
    if group.backend == "nccl":
        _check_nccl_devices(operation, everyone)


def _mismatch_error(
    operation: str,
    everyone: list[list[LeafRecord]],
    keys: list[list[Hashable]],
    hint: str,
) -> DistributedOperationError:
    longest = max(len(records) for records in everyone)
    differing = [
        index
        for index in range(longest)
        if len({_key_at(process_keys, index) for process_keys in keys}) > 1
    ]
    shown = range(longest) if longest <= _MAX_LISTED_LEAVES else differing[:_MAX_LISTED_LEAVES]
    descriptions = [_render_process(records, shown, longest) for records in everyone]
    lines = [
        f"{operation}: the operands differ across the {len(everyone)} processes, so the "
        "collective would hang or return garbage. Each process passed:",
        *(f"  - process {rank}: {text}" for rank, text in enumerate(descriptions)),
    ]
    if differing and longest > 1:
        lines.append(_first_difference(everyone, differing[0]))
    if hint:
        lines.append(f"Fix: {hint}")
    return DistributedOperationError("\n".join(lines), operation, descriptions)


def _first_difference(everyone: list[list[LeafRecord]], index: int) -> str:
    present = [records[index] for records in everyone if index < len(records)]
    paths = {record.path for record in present}
    if len(present) == len(everyone) and len(paths) == 1:
        where = f"data{present[0].path}"
        held = ", ".join(
            f"process {rank} has {records[index].render().split(': ', 1)[1]}"
            for rank, records in enumerate(everyone)
        )
        return f"First difference at {where}: {held}."
    held = ", ".join(
        f"process {rank} has {_render_at(records, index)}" for rank, records in enumerate(everyone)
    )
    return f"First difference at leaf #{index}: {held}."


def _key_at(process_keys: Sequence[Hashable], index: int) -> Hashable:
    return process_keys[index] if index < len(process_keys) else "<missing>"


def _render_at(records: list[LeafRecord], index: int) -> str:
    return records[index].render() if index < len(records) else "<no such leaf>"


def _render_process(records: list[LeafRecord], shown: Sequence[int], longest: int) -> str:
    if not records:
        return "no tensors (an empty structure)"
    parts = [records[index].render() for index in shown if index < len(records)]
    hidden = len(records) - len(parts)
    text = ", ".join(parts)
    if hidden:
        text += f" (+{hidden} matching leaves not shown)"
    if len(records) != longest:
        text += f" [{len(records)} leaves]"
    return text


def _check_nccl_devices(operation: str, everyone: list[list[LeafRecord]]) -> None:
    misplaced = [
        f"process {rank}: {record.render()}"
        for rank, records in enumerate(everyone)
        for record in records
        if record.kind == "tensor" and record.device == "cpu"
    ]
    if misplaced:
        raise DistributedOperationError(
            f"{operation}: the nccl backend only communicates CUDA tensors, but "
            + "; ".join(misplaced[:_MAX_LISTED_LEAVES])
            + ". Fix: move the data first, e.g. send_to_device(data, 'cuda').",
            operation,
            [],
        )
