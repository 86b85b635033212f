"""Worker functions run on real spawned gloo processes by the distributed tests.

They live in their own module so that spawned processes can import them by name. Each one batches
many checks (a spawn costs seconds of torch import) and asserts inside the worker, so a failure
reports the rank and the traceback.
"""

import collections
import dataclasses
import os
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

import accel_ops
from accel_ops.structures import named_leaves


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


@dataclasses.dataclass
class Holder:
    value: torch.Tensor


class ReadOnlyMapping(collections.abc.Mapping):
    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def start_group(how):
    if how == "partial_state":
        from accel_state import PartialState

        state = PartialState(cpu=True)
        assert state.num_processes == int(os.environ["WORLD_SIZE"])
    else:
        dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def collective_count():
    """How many collectives the default group has run (gloo's sequence number)."""
    group = dist.distributed_c10d._get_default_group()
    getter = getattr(group, "_get_sequence_number_for_group", None)
    return getter() if getter is not None else None


def nested(rank):
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 100 * rank
    return {
        "tensor": base,
        "list": [base[0], base[1]],
        "tuple": (torch.tensor(float(rank)),),
        "namedtuple": Pair(first=base, second=base.long()),
        "dataclass": Holder(value=base.T),  # not contiguous
        "ordered": collections.OrderedDict(x=base.to(torch.bfloat16)),
        "mapping": ReadOnlyMapping({"y": base > 102}),
    }


def assert_same_containers(result, data):
    assert type(result) is type(data)
    for key, value in data.items():
        assert type(result[key]) is type(value), key
    assert isinstance(result["namedtuple"], Pair) and isinstance(result["dataclass"], Holder)


def expected_gather(world_size, make):
    per_rank = [named_leaves(make(rank)) for rank in range(world_size)]
    expected = []
    for index, (path, _) in enumerate(per_rank[0]):
        parts = [leaves[index][1] for leaves in per_rank]
        parts = [part.reshape(1) if part.ndim == 0 else part for part in parts]
        expected.append((path, torch.cat(parts)))
    return expected


def assert_leaves_equal(result, expected):
    got = named_leaves(result)
    assert [path for path, _ in got] == [path for path, _ in expected]
    for (path, tensor), (_, want) in zip(got, expected, strict=True):
        assert tensor.dtype == want.dtype, (path, tensor.dtype, want.dtype)
        assert torch.equal(tensor, want), (path, tensor, want)


def check_gather(rank, world_size):
    data = nested(rank)
    gathered = accel_ops.gather(data)
    assert_same_containers(gathered, data)
    assert_leaves_equal(gathered, expected_gather(world_size, nested))
    assert accel_ops.gather(torch.tensor(rank)).tolist() == list(range(world_size))
    empty = accel_ops.gather({"e": torch.empty(0, 4, dtype=torch.int64)})
    assert empty["e"].shape == (0, 4) and empty["e"].dtype == torch.int64
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool):
        result = accel_ops.gather([(torch.arange(4) + rank).to(dtype)])[0]
        want = torch.cat([(torch.arange(4) + k).to(dtype) for k in range(world_size)])
        assert result.dtype == dtype and torch.equal(result, want), dtype
    try:
        accel_ops.gather({"ok": torch.ones(1), "bad": ["text"]})
    except accel_ops.UnsupportedTypeError as error:
        assert "data['bad'][0]" in str(error) and "gather_object" in str(error)
    else:
        raise AssertionError("gather accepted a string leaf")


def check_padding(rank, world_size):
    # Ragged along dim 0, and empty on rank 0.
    ragged = {"rows": torch.full((rank, 4), float(rank + 1)), "scalar": torch.tensor(7)}
    padded = accel_ops.pad_across_processes(ragged, dim=0, pad_index=-1)
    top = world_size - 1
    assert padded["rows"].shape == (top, 4) and padded["scalar"].shape == ()
    assert (padded["rows"][:rank] == rank + 1).all() and (padded["rows"][rank:] == -1).all()
    gathered = accel_ops.gather(padded)["rows"]
    assert gathered.shape == (world_size * top, 4)
    for k in range(world_size):
        block = gathered[k * top : (k + 1) * top]
        assert (block[:k] == k + 1).all() and (block[k:] == -1).all()
    # Ragged along the last dimension, padded first, int64 and bool keep their dtype.
    tokens = [torch.ones(2, rank + 1, dtype=torch.int64), torch.ones(rank + 1, dtype=torch.bool)]
    padded = accel_ops.pad_across_processes(tokens, dim=-1, pad_index=0, pad_first=True)
    assert padded[0].shape == (2, world_size) and padded[0].dtype == torch.int64
    assert padded[0][0].tolist() == [0] * (world_size - rank - 1) + [1] * (rank + 1)
    assert padded[1].dtype == torch.bool and padded[1].sum().item() == rank + 1
    gathered = accel_ops.gather(padded)
    assert gathered[0].shape == (2 * world_size, world_size)
    assert gathered[1].shape == (world_size * world_size,)
    # Already equal: the very same tensor comes back.
    same = torch.ones(3)
    assert accel_ops.pad_across_processes(same) is same


def check_broadcast(rank, world_size):
    source = world_size - 1
    matrix = torch.full((3, 2), float(rank)).T  # not contiguous
    data = {
        "m": matrix,
        "p": Pair(torch.tensor(rank), torch.full((2,), rank, dtype=torch.bfloat16)),
        "flags": [torch.tensor([rank % 2 == 0, True])],
    }
    result = accel_ops.broadcast(data, from_process=source)
    assert result["m"] is matrix and (matrix == source).all()
    assert isinstance(result["p"], Pair) and result["p"].first.item() == source
    assert result["p"].second.dtype == torch.bfloat16 and (result["p"].second == source).all()
    assert result["flags"][0].tolist() == [source % 2 == 0, True]
    objects = [rank, {"rank": rank}, None]
    assert accel_ops.broadcast_object_list(objects, from_process=1) is objects
    assert objects == [1, {"rank": 1}, None]
    received = accel_ops.broadcast_object_list(
        [Pair(torch.arange(2), "text")] if rank == 0 else [None] * rank
    )
    assert len(received) == 1 and torch.equal(received[0].first, torch.arange(2))
    held = {"w": torch.arange(4) * 10, "b": [torch.ones(2, dtype=torch.float16)]}
    copied = accel_ops.copy_tensor_to_devices(held if rank == source else None)
    assert copied["w"].tolist() == [0, 10, 20, 30]
    assert copied["b"][0].dtype == torch.float16


def check_reduce(rank, world_size):
    data = {"a": torch.full((2,), float(rank + 1)), "b": [torch.full((3,), rank + 1.0).half()]}
    total = sum(range(1, world_size + 1))
    summed = accel_ops.reduce(data, "sum")
    assert summed["a"].tolist() == [total, total] and summed["b"][0].dtype == torch.float16
    mean = accel_ops.reduce(data, "mean", scale=2.0)
    assert torch.allclose(mean["a"], torch.full((2,), 2.0 * total / world_size))
    assert accel_ops.reduce(data, "max")["b"][0].tolist() == [float(world_size)] * 3
    assert accel_ops.reduce(data, "none")["a"].tolist() == [rank + 1.0] * 2
    assert data["a"].tolist() == [rank + 1.0] * 2  # inputs untouched
    ints = accel_ops.reduce(torch.tensor([rank, 1]), "sum")
    assert ints.dtype == torch.int64 and ints.tolist() == [sum(range(world_size)), world_size]
    flags = accel_ops.reduce(torch.tensor([rank == 0, False]), "max")
    assert flags.dtype == torch.bool and flags.tolist() == [True, False]
    bf16 = accel_ops.reduce(torch.ones(2, dtype=torch.bfloat16), "mean")
    assert bf16.dtype == torch.bfloat16 and bf16.tolist() == [1.0, 1.0]


def check_objects(rank, world_size):
    gathered = accel_ops.gather_object([f"rank{rank}"] * (rank + 1))
    assert gathered == [f"rank{k}" for k in range(world_size) for _ in range(k + 1)]
    assert accel_ops.gather_object(({"r": rank},)) == [{"r": k} for k in range(world_size)]
    assert accel_ops.gather_object([]) == []
    rows = accel_ops.gather_object(torch.full((rank + 1, 2), rank))  # a tensor: its rows
    assert [row.tolist() for row in rows] == [
        [k, k] for k in range(world_size) for _ in range(k + 1)
    ]
    try:
        accel_ops.gather_object({"rank": rank} if rank == 1 else [rank])
    except accel_ops.UnsupportedTypeError as error:
        assert "process 1 passed a dict" in str(error) and "gather_object([obj])" in str(error)
    else:
        raise AssertionError("gather_object accepted a dict")


def check_no_extra_communication():
    before = collective_count()
    if before is None:
        return None
    accel_ops.gather({"a": torch.ones(1), "b": [torch.ones(2), torch.ones(3)]})
    accel_ops.reduce(torch.ones(1), "sum")
    accel_ops.broadcast(torch.ones(1))
    return collective_count() - before


def collectives_worker(how):
    rank, world_size = start_group(how)
    assert not accel_ops.is_debug_mode()
    check_gather(rank, world_size)
    check_padding(rank, world_size)
    check_broadcast(rank, world_size)
    check_reduce(rank, world_size)
    check_objects(rank, world_size)
    extra = check_no_extra_communication()
    dist.barrier()
    return {"rank": rank, "world_size": world_size, "collectives": extra}


def expect_error(operation, *args, **kwargs):
    started = time.monotonic()
    try:
        operation(*args, **kwargs)
    except accel_ops.DistributedOperationError as error:
        return str(error), time.monotonic() - started
    raise AssertionError(f"{operation.__name__} did not raise")


def debug_worker():
    rank, world_size = start_group("direct")
    assert accel_ops.is_debug_mode()  # from ACCEL_DEBUG_MODE=1, via LaunchContract
    messages = {}
    timings = []
    message, seconds = expect_error(accel_ops.gather, {"x": torch.ones(rank + 1, 2)})
    for k in range(world_size):
        assert f"process {k}: data['x']: float32[{k + 1}, 2] on cpu" in message, message
    assert "pad_across_processes" in message
    messages["gather"] = message
    timings.append(seconds)
    dtype = torch.float64 if rank == 0 else torch.float32
    messages["reduce"], seconds = expect_error(accel_ops.reduce, torch.ones(2, dtype=dtype))
    timings.append(seconds)
    keys = {"a": torch.ones(1)} if rank == 0 else {"b": torch.ones(1)}
    messages["broadcast"], seconds = expect_error(accel_ops.broadcast, keys)
    timings.append(seconds)
    dims = torch.ones(2, 2) if rank == 0 else torch.ones(2)
    messages["pad"], seconds = expect_error(accel_ops.pad_across_processes, [dims])
    timings.append(seconds)
    leaf = "text" if rank == 0 else torch.ones(1)
    messages["type"], seconds = expect_error(accel_ops.gather, [leaf])
    timings.append(seconds)
    many = {f"k{i}": torch.ones(3 if (i == 7 and rank == 1) else 2) for i in range(12)}
    messages["many"], seconds = expect_error(accel_ops.gather, many)
    timings.append(seconds)
    # The group is still healthy, and matching operands pass the check.
    assert accel_ops.gather(torch.tensor([rank])).tolist() == list(range(world_size))
    # Debug mode costs extra collectives; turning it off removes every one of them.
    before = collective_count()
    accel_ops.gather([torch.ones(1), torch.ones(1)])
    with_debug = None if before is None else collective_count() - before
    accel_ops.set_debug_mode(False)
    before = collective_count()
    accel_ops.gather([torch.ones(1), torch.ones(1)])
    without_debug = None if before is None else collective_count() - before
    # An explicit argument wins over the toggle.
    messages["argument"], seconds = expect_error(accel_ops.gather, torch.ones(rank + 1), debug=True)
    timings.append(seconds)
    dist.barrier()
    return {
        "messages": messages,
        "max_seconds": max(timings),
        "with_debug": with_debug,
        "without_debug": without_debug,
    }


def nccl_worker():
    """The NCCL paths (all_gather_into_tensor, device checks) on one GPU per process."""
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="env://", device_id=torch.device("cuda", rank))
    world_size = dist.get_world_size()
    device = torch.device("cuda", rank)
    data = accel_ops.send_to_device(nested(rank), device)
    gathered = accel_ops.gather(data)
    assert_same_containers(gathered, data)
    assert_leaves_equal(
        accel_ops.send_to_device(gathered, "cpu"), expected_gather(world_size, nested)
    )
    ragged = torch.ones(rank + 1, 2, device=device)
    padded = accel_ops.gather(accel_ops.pad_across_processes(ragged, pad_index=-1))
    assert padded.shape == (world_size * world_size, 2) and padded.is_cuda
    summed = accel_ops.reduce(torch.ones(3, device=device), "sum")
    assert summed.tolist() == [float(world_size)] * 3
    source = torch.full((2,), float(rank), device=device)
    assert accel_ops.broadcast(source, from_process=1).tolist() == [1.0, 1.0]
    assert accel_ops.gather_object([rank]) == list(range(world_size))
    copied = accel_ops.copy_tensor_to_devices(torch.arange(3, device=device) if rank == 0 else None)
    assert copied.is_cuda and copied.tolist() == [0, 1, 2]
    message, _ = expect_error(accel_ops.gather, torch.ones(2), debug=True)
    assert "only communicates CUDA tensors" in message
    dist.barrier()
    return rank


def objects_by_rank_worker():
    """gather_objects_by_rank on the default group and on a group of its own; gather and
    gather_object over the group of the ranks of this one's parity (a mesh dimension's kind)."""
    rank, world_size = start_group("direct")
    side_group = dist.new_group(backend="gloo")
    default = accel_ops.gather_objects_by_rank({"rank": rank, "tail": "x" * rank})
    explicit = accel_ops.gather_objects_by_rank([rank] * (rank + 1), process_group=side_group)
    parity, _ = dist.new_subgroups_by_enumeration(
        [list(range(0, world_size, 2)), list(range(1, world_size, 2))]
    )
    grouped = (
        accel_ops.gather(torch.tensor([rank]), process_group=parity).tolist(),
        accel_ops.gather_object([f"r{rank}"], process_group=parity),
    )
    return default, explicit, grouped


def keyword_worker():
    """Every operation called with Accelerate's keyword names; returns plain results."""
    from accel_state import PartialState

    state = PartialState(cpu=True)
    rank, world_size = state.process_index, state.num_processes
    mine = torch.tensor([float(rank)])
    ragged = torch.arange(rank + 1, dtype=torch.float32)
    source = torch.tensor([10.0 + rank])
    out = {
        "gather": accel_ops.gather(tensor=mine).tolist(),
        "reduce": accel_ops.reduce(tensor=mine + 1, reduction="sum").tolist(),
        "broadcast": accel_ops.broadcast(tensor=source, from_process=0).tolist(),
        "pad": accel_ops.pad_across_processes(tensor=ragged, dim=0, pad_index=-1).tolist(),
        "send": accel_ops.send_to_device(tensor={"x": mine}, device="cpu")["x"].tolist(),
        "objects": accel_ops.gather_object(object=[f"r{rank}"]),
        "fp32": str(accel_ops.convert_to_fp32(tensor=mine.half()).dtype),
        "copied": accel_ops.copy_tensor_to_devices(
            tensor=torch.tensor([7.0]) if rank == 0 else None
        ).tolist(),
    }
    return {"rank": rank, "world_size": world_size, **out}


def skipped_collective_worker(operation: str) -> dict:
    """Rank 1 skips ``operation`` and goes on to the next reduce: both ranks must time out.

    Returns what each rank's error says, and how long it waited (the group timeout is 3 s).
    """
    from accel_state import PartialState

    rank = PartialState().process_index
    accel_ops.reduce(torch.ones(2))
    entered = time.monotonic()
    try:
        if rank == 0 and operation == "gather":
            accel_ops.gather(torch.ones(4))  # rank 0: gather
        elif rank == 0:
            accel_ops.gather_object([rank])  # rank 0: gather_object
        else:
            accel_ops.reduce(torch.ones(3))  # rank 1: skipped it
    except accel_ops.CollectiveTimeoutError as error:
        return {
            "message": str(error),
            "descriptions": error.descriptions,
            "seconds": time.monotonic() - entered,
            "cause": repr(error.__cause__),
        }
    return {"message": None}


def verification_worker():
    """verify_operation / chained_operation / gather_tensor_shape on real processes."""
    rank, _world_size = start_group("direct")

    @accel_ops.verify_operation
    def total(tensor):
        return accel_ops.reduce(tensor, reduction="sum", debug=False)

    @accel_ops.chained_operation
    def outer(tensor):
        return total(tensor)

    accel_ops.set_debug_mode(True)
    try:
        same = total(torch.ones(2)).tolist()
        try:
            outer(tensor=torch.ones(rank + 1))
        except accel_ops.DistributedOperationError as error:
            chained = (str(error), str(error.__cause__))
        else:
            chained = None
    finally:
        accel_ops.set_debug_mode(None)
    held = torch.arange(6, dtype=torch.int16).reshape(2, 3) if rank == 1 else None
    shape, code = accel_ops.gather_tensor_shape(held)
    return {
        "same": same,
        "chained": chained,
        "shape": shape.tolist(),
        "dtype": str(accel_ops.TENSOR_INT_TO_DTYPE[code]),
    }
