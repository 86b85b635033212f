"""torch_xla code paths (run by the xla leg: PJRT_DEVICE=CPU, one XLA device).

torch_xla 2.9's CPU client runs several devices as threads of one process, and its cross-device
collectives do not rendezvous there, so the XLA branch is driven here with one replica: every
public collective runs through torch_xla with a one-replica XLA group (``one_replica``), and on
XLA tensors without a group. ``test_every_collective_across_replicas`` needs a TPU VM.
"""

import dataclasses

import pytest
import torch
import xla_workers
from _accel_ops_workers import Holder, Pair

import accel_ops
from accel_ops import collectives, objects, padding
from accel_ops import xla as xla_paths
from accel_ops.group import GroupInfo, default_device
from accel_ops.transport import broadcast_tensor, gather_tensor
from accel_state.testing import spawn_xla_workers

pytestmark = pytest.mark.xla

XLA_GROUP = GroupInfo(world_size=1, rank=0, backend="xla")


@pytest.fixture(scope="module")
def device():
    return xla_paths.device()


@pytest.fixture
def one_replica(monkeypatch):
    """The collectives see a one-replica job on the ``xla`` backend and take torch_xla's path."""
    for module in (collectives, objects, padding):
        monkeypatch.setattr(module, "current_group", lambda: XLA_GROUP)


def on_xla(value):
    assert isinstance(value, torch.Tensor) and value.device.type == "xla", value
    return value.cpu().tolist()


def test_xla_device_and_default_device(device):
    assert device.type == "xla"
    assert default_device(XLA_GROUP).type == "xla"


def test_transport_primitives(device):
    matrix = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(gather_tensor(matrix.to(device), XLA_GROUP).cpu(), matrix)
    assert gather_tensor(torch.tensor(4.0, device=device), XLA_GROUP).cpu().tolist() == [4.0]
    target = torch.ones(2, device=device)
    assert broadcast_tensor(target, XLA_GROUP, 0) is target
    assert target.cpu().tolist() == [1.0, 1.0]
    assert xla_paths.all_gather_objects({"rank": 0}) == [{"rank": 0}]
    assert xla_paths.broadcast_objects([1, None], 0) == [1, None]


@pytest.mark.parametrize("debug", [False, True])
def test_gather_through_torch_xla(device, one_replica, debug):
    data = {
        "m": torch.arange(6.0, device=device).reshape(2, 3),
        "s": torch.tensor(5, device=device),
    }
    gathered = accel_ops.gather(data, debug=debug)
    assert on_xla(gathered["m"]) == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert on_xla(gathered["s"]) == [5]
    pair = accel_ops.gather(Pair(torch.ones(1, device=device), torch.zeros(2, device=device)))
    assert isinstance(pair, Pair) and on_xla(pair.second) == [0.0, 0.0]


@dataclasses.dataclass
class Label:
    name: str


def test_gather_object_and_broadcast_object_list_through_torch_xla(one_replica):
    assert accel_ops.gather_object([1, "two", {"three": 3}]) == [1, "two", {"three": 3}]
    assert accel_ops.gather_object([Label("cat")]) == [Label("cat")]  # any picklable class
    received = [None, None]
    assert accel_ops.broadcast_object_list(received) is received  # filled in place
    assert received == [None, None]
    items = ["a", 2]
    assert accel_ops.broadcast_object_list(items, from_process=0) == ["a", 2]
    assert accel_ops.gather_objects_by_rank({"r": 0}) == [{"r": 0}]


def test_broadcast_through_torch_xla(device, one_replica):
    holder = Holder(torch.tensor([1.0, 2.0], device=device))
    result = accel_ops.broadcast(holder, from_process=0)
    assert isinstance(result, Holder) and on_xla(result.value) == [1.0, 2.0]
    with pytest.raises(accel_ops.InvalidArgumentError, match="from_process=1"):
        accel_ops.broadcast(holder, from_process=1)


def test_reduce_through_torch_xla(device, one_replica):
    values = torch.tensor([1.0, -2.0, 3.0], device=device)
    assert on_xla(accel_ops.reduce(values, "sum")) == [1.0, -2.0, 3.0]
    assert on_xla(accel_ops.reduce(values, "mean", scale=2.0)) == [2.0, -4.0, 6.0]
    assert on_xla(accel_ops.reduce({"v": values}, "max")["v"]) == [1.0, -2.0, 3.0]
    assert on_xla(accel_ops.reduce(torch.tensor([3, 1], device=device), "max")) == [3, 1]
    assert on_xla(accel_ops.reduce(values, "none", scale=0.5)) == [0.5, -1.0, 1.5]
    assert values.cpu().tolist() == [1.0, -2.0, 3.0]  # inputs untouched
    with pytest.raises(accel_ops.InvalidArgumentError, match="floating-point"):
        accel_ops.reduce(torch.tensor([1], device=device), "mean")


def test_pad_across_processes_through_torch_xla(device, one_replica):
    data = {"a": torch.ones(2, 3, device=device), "b": [torch.arange(4, device=device)]}
    padded = accel_ops.pad_across_processes(data, dim=1, pad_index=-1)
    assert on_xla(padded["a"]) == [[1.0] * 3] * 2  # already the largest: unchanged
    assert padded["b"][0] is data["b"][0]  # no dimension 1: returned as it is
    tail = accel_ops.pad_input_tensors(torch.ones(3, 2, device=device), 3, 2)
    assert on_xla(tail) == [[1.0, 1.0]] * 3 + [[0.0, 0.0]]


def test_copy_tensor_to_devices_through_torch_xla(device, one_replica):
    copied = accel_ops.copy_tensor_to_devices({"x": torch.tensor([4.0], device=device)})
    assert on_xla(copied["x"]) == [4.0]


def test_public_operations_without_a_group_keep_xla_tensors(device):
    data = {"a": torch.ones(2, device=device), "b": [torch.zeros(1, device=device)]}
    assert accel_ops.gather(data) is data  # one process: unchanged
    assert accel_ops.broadcast(data) is data
    assert accel_ops.pad_across_processes(data) is data
    assert accel_ops.gather_object(["x"]) == ["x"]
    assert accel_ops.broadcast_object_list([1]) == [1]
    assert on_xla(accel_ops.reduce(data, "sum", scale=3.0)["a"]) == [3.0, 3.0]


def test_send_to_device_moves_nested_structures_both_ways(device):
    batch = {
        "pair": Pair(torch.ones(2), torch.zeros(1)),
        "holder": Holder(torch.arange(3)),
        "items": [torch.ones(1), "label", 3],
        "keep": torch.ones(1),
    }
    moved = accel_ops.send_to_device(batch, device, skip_keys="keep")
    assert isinstance(moved["pair"], Pair) and moved["pair"].first.device.type == "xla"
    assert isinstance(moved["holder"], Holder) and moved["holder"].value.device.type == "xla"
    assert moved["items"][0].device.type == "xla" and moved["items"][1:] == ["label", 3]
    assert moved["keep"].device.type == "cpu"
    back = accel_ops.send_to_device(moved, "cpu")
    assert back["holder"].value.tolist() == [0, 1, 2] and back["pair"].first.device.type == "cpu"
    module = accel_ops.send_to_device(torch.nn.Linear(2, 2), device)
    assert module.weight.device.type == "xla"


def check_collectives(results: list[dict]) -> None:
    """What every replica of a ``len(results)``-replica job must have received."""
    world = len(results)
    ranks = list(range(world))
    for rank, got in enumerate(results):
        assert got["device"] == "xla" and got["world"] == world
        assert got["gather"] == [float(r) for r in ranks for _ in range(2)]
        # A 0-d tensor becomes one value per process; a single process gets it back unchanged.
        assert got["gather_0d"] == ([float(r) for r in ranks] if world > 1 else 0.0)
        assert got["gather_object"] == [item for r in ranks for item in (r, f"r{r}")]
        assert got["broadcast"] == [7.0] * 3
        assert got["broadcast_object_list"] == ["from 0"]
        assert got["sum"] == [float(sum(ranks))] * 2
        assert got["mean"] == [sum(ranks) / world] * 2
        assert got["max"] == [float(world - 1)] * 2
        assert got["padded"] == list(range(rank + 1)) + [-1] * (world - 1 - rank)
        assert got["copied"] == [0.0, 0.0]


def test_every_collective_in_a_one_replica_job(xla_state):
    check_collectives([xla_workers.all_collectives()])  # the TPU worker, on this one device


@pytest.mark.xla(min_devices=2)
def test_every_collective_across_replicas(xla_state):
    results = spawn_xla_workers(xla_workers.all_collectives, timeout=600)
    assert len(results) >= 2
    check_collectives(results)
