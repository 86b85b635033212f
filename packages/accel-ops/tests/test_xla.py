"""torch_xla code paths (run by the xla leg: PJRT_DEVICE=CPU, one XLA device).

torch_xla 2.9's CPU client runs several devices as threads of one process, and its cross-device
collectives do not rendezvous there, so these tests drive the XLA branch with one device: they
check that every torch_xla call accel-ops makes exists and returns what the code expects.
"""

import pytest
import torch

from accel_ops import gather, reduce, send_to_device
from accel_ops import xla as xla_paths
from accel_ops.collectives import _reduce_tensor
from accel_ops.group import GroupInfo, default_device
from accel_ops.transport import broadcast_tensor, gather_tensor

pytestmark = pytest.mark.xla

XLA_GROUP = GroupInfo(world_size=1, rank=0, backend="xla")


@pytest.fixture(scope="module")
def device():
    return xla_paths.device()


def test_xla_device_and_default_device(device):
    assert device.type == "xla"
    assert default_device(XLA_GROUP).type == "xla"


def test_xla_gather_reduce_broadcast(device):
    matrix = torch.arange(6.0).reshape(2, 3)
    gathered = gather_tensor(matrix.to(device), XLA_GROUP)
    assert torch.equal(gathered.cpu(), matrix)
    assert gather_tensor(torch.tensor(4.0, device=device), XLA_GROUP).cpu().tolist() == [4.0]
    mean = _reduce_tensor(matrix.to(device), XLA_GROUP, "mean", 2.0)
    assert torch.equal(mean.cpu(), matrix * 2)
    peak = _reduce_tensor(torch.tensor([3, 1], device=device), XLA_GROUP, "max", 1.0)
    assert peak.cpu().tolist() == [3, 1]
    target = torch.ones(2, device=device)
    broadcast_tensor(target, XLA_GROUP, 0)
    assert target.cpu().tolist() == [1.0, 1.0]


def test_xla_object_exchange():
    assert xla_paths.all_gather_objects({"rank": 0}) == [{"rank": 0}]
    assert xla_paths.broadcast_objects([1, None], 0) == [1, None]


def test_public_operations_accept_xla_tensors(device):
    data = send_to_device({"a": torch.ones(2), "b": [torch.zeros(1)]}, device)
    assert data["a"].device.type == "xla"
    assert gather(data) is data  # one process: unchanged
    assert reduce(data, "sum")["a"].cpu().tolist() == [1.0, 1.0]
    back = send_to_device(data, "cpu")
    assert back["b"][0].device.type == "cpu"
