"""Checks of accel's cross-process operations on however many processes run this program.

Every process builds data that depends on its rank, calls one collective, and asserts the
documented result: :func:`~accel.utils.gather` concatenates in rank order,
:func:`~accel.utils.gather_object` flattens the per-process lists, :func:`~accel.utils.broadcast`
copies one process's tensor, :func:`~accel.utils.pad_across_processes` pads to the longest
length, :func:`~accel.utils.reduce` sums or averages, and a shape mismatch under ``debug=True``
raises :class:`~accel.utils.DistributedOperationException` instead of hanging.

Run with ``debug_launcher(test_ops.main)``, ``accel launch test_ops.py`` or ``python test_ops.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from accel.state import PartialState
from accel.utils import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    copy_tensor_to_devices,
    find_batch_size,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    send_to_device,
)


def _check(condition: bool, what: str, got: Any, expected: Any) -> None:
    if not condition:
        raise AssertionError(f"{what}: got {got!r}, expected {expected!r}")


def _rank_tensor(state: PartialState, length: int = 3) -> torch.Tensor:
    """``[r*length, ..., r*length + length - 1]`` on this process's device, as floats."""
    start = state.process_index * length
    return torch.arange(start, start + length, dtype=torch.float32, device=state.device)


def check_gather(state: PartialState) -> None:
    """``gather`` concatenates every process's tensor along dim 0, in rank order."""
    gathered = gather(_rank_tensor(state))
    expected = torch.arange(state.num_processes * 3, dtype=torch.float32)
    _check(torch.equal(gathered.cpu(), expected), "gather", gathered.tolist(), expected.tolist())


def check_gather_nested(state: PartialState) -> None:
    """``gather`` keeps a dict/tuple structure and gathers each tensor inside it."""
    rank = state.process_index
    data = {
        "a": _rank_tensor(state, 2),
        "b": (torch.full((1, 2), float(rank), device=state.device),),
    }
    gathered = gather(data)
    _check(set(gathered) == {"a", "b"}, "gather(dict) keys", sorted(gathered), ["a", "b"])
    _check(
        tuple(gathered["b"][0].shape) == (state.num_processes, 2),
        "gather(dict)['b'][0].shape",
        tuple(gathered["b"][0].shape),
        (state.num_processes, 2),
    )
    ranks = gathered["b"][0][:, 0].cpu().tolist()
    _check(
        ranks == [float(r) for r in range(state.num_processes)],
        "gather rank order",
        ranks,
        "0..n-1",
    )


def check_gather_object(state: PartialState) -> None:
    """``gather_object`` flattens one list per process into one list, in rank order."""
    rank = state.process_index
    gathered = gather_object([f"rank{rank}", rank])
    expected: list[Any] = []
    for other in range(state.num_processes):
        expected += [f"rank{other}", other]
    _check(gathered == expected, "gather_object", gathered, expected)


def check_broadcast(state: PartialState) -> None:
    """``broadcast`` gives every process the tensor of ``from_process``."""
    source = state.num_processes - 1
    result = broadcast(_rank_tensor(state), from_process=source)
    expected = torch.arange(source * 3, source * 3 + 3, dtype=torch.float32)
    _check(torch.equal(result.cpu(), expected), "broadcast", result.tolist(), expected.tolist())
    objects = broadcast_object_list([state.process_index, {"rank": state.process_index}])
    _check(objects == [0, {"rank": 0}], "broadcast_object_list", objects, [0, {"rank": 0}])


def check_pad_across_processes(state: PartialState) -> None:
    """Every process's tensor is padded (at the end, or at the start) to the longest length."""
    rank, longest = state.process_index, state.num_processes
    tensor = torch.ones(rank + 1, 2, device=state.device)
    padded = pad_across_processes(tensor, pad_index=-1)
    _check(tuple(padded.shape) == (longest, 2), "pad_across_processes shape", padded.shape, longest)
    _check(bool((padded[: rank + 1] == 1).all()), "pad_across_processes keeps data", padded, "ones")
    _check(bool((padded[rank + 1 :] == -1).all()), "pad_across_processes pad value", padded, -1)
    first = pad_across_processes(tensor, pad_index=-1, pad_first=True)
    _check(
        bool((first[longest - rank - 1 :] == 1).all()), "pad_first keeps data at the end", first, 1
    )
    along_1 = pad_across_processes(torch.zeros(2, rank + 1, device=state.device), dim=1)
    _check(
        tuple(along_1.shape) == (2, longest), "pad_across_processes(dim=1)", along_1.shape, longest
    )


def check_reduce(state: PartialState) -> None:
    """``reduce`` sums (or averages) the tensors of all processes; ``scale`` multiplies the result."""
    n = state.num_processes
    total = float(sum(range(n)))
    value = torch.tensor([float(state.process_index), 1.0], device=state.device)
    summed = reduce(value, reduction="sum")
    _check(summed.cpu().tolist() == [total, float(n)], "reduce(sum)", summed.tolist(), [total, n])
    mean = reduce(value.clone(), reduction="mean")
    _check(
        torch.allclose(mean.cpu(), torch.tensor([total / n, 1.0])),
        "reduce(mean)",
        mean.tolist(),
        [total / n, 1.0],
    )
    scaled = reduce(value.clone(), reduction="sum", scale=2.0)
    _check(
        scaled.cpu().tolist() == [2 * total, 2.0 * n], "reduce(scale=2)", scaled.tolist(), 2 * total
    )


def check_copy_tensor_to_devices(state: PartialState) -> None:
    """``copy_tensor_to_devices`` gives every process the main process's tensor."""
    tensor = torch.tensor([7.0, 8.0], device=state.device) if state.is_main_process else None
    copied = copy_tensor_to_devices(tensor)
    _check(copied.cpu().tolist() == [7.0, 8.0], "copy_tensor_to_devices", copied.tolist(), [7, 8])


def check_debug_mismatch(state: PartialState) -> None:
    """Under ``debug=True`` a collective over tensors of different shapes raises, on every process."""
    if state.num_processes < 2:
        return
    mismatched = torch.zeros(state.process_index + 1, device=state.device)
    try:
        gather(mismatched, debug=True)
    except DistributedOperationException:
        return
    raise AssertionError("gather(debug=True) of tensors of different shapes did not raise")


def check_local_helpers(state: PartialState) -> None:
    """``concatenate``, ``find_batch_size`` and ``send_to_device`` on nested data (no collective)."""
    batch = {"x": torch.ones(4, 3), "y": [torch.zeros(4)]}
    _check(find_batch_size(batch) == 4, "find_batch_size", find_batch_size(batch), 4)
    joined = concatenate([batch, batch])
    _check(tuple(joined["x"].shape) == (8, 3), "concatenate", tuple(joined["x"].shape), (8, 3))
    moved = send_to_device(batch, state.device)
    _check(
        moved["y"][0].device.type == state.device.type,
        "send_to_device",
        moved["y"][0].device,
        state.device,
    )


def main() -> None:
    """Run every check on this process (a collective one on every process of the job)."""
    state = PartialState()
    for check in (
        check_gather,
        check_gather_nested,
        check_gather_object,
        check_broadcast,
        check_pad_across_processes,
        check_reduce,
        check_copy_tensor_to_devices,
        check_debug_mismatch,
        check_local_helpers,
    ):
        state.print(f"test_ops: {check.__name__}")
        check(state)
    state.wait_for_everyone()
    state.print("test_ops: all checks passed")


if __name__ == "__main__":
    main()
