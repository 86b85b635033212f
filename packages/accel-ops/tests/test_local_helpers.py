"""Unit tests for the helpers that never communicate: batching, conversion, device transfer."""

import collections
import dataclasses
import pickle

import pytest
import torch

from accel_ops import (
    ConvertOutputsToFp32,
    InvalidArgumentError,
    UnsupportedTypeError,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    ignorant_find_batch_size,
    listify,
    pad_input_tensors,
    send_to_device,
    slice_tensors,
)


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    labels: torch.Tensor


class Encoding(collections.UserDict):
    """Mimics transformers' BatchEncoding: a Mapping with its own ``.to``."""

    def __init__(self, data):
        super().__init__(data)
        self.moved_to = None

    def to(self, device, non_blocking=False):
        moved = Encoding({key: value.to(device) for key, value in self.data.items()})
        moved.moved_to = torch.device(device)
        return moved


class LegacyTo:
    """An object whose ``.to`` takes no ``non_blocking`` argument."""

    def __init__(self):
        self.device = None

    def to(self, device):
        self.device = device
        return self


def test_find_batch_size():
    assert find_batch_size(torch.ones(5, 2)) == 5
    assert find_batch_size({"a": [torch.ones(3)], "b": torch.ones(9)}) == 3
    assert find_batch_size((torch.ones(4, 1),)) == 4
    assert find_batch_size(Batch(torch.ones(6), torch.ones(6))) == 6
    with pytest.raises(InvalidArgumentError, match="empty list"):
        find_batch_size([])
    with pytest.raises(UnsupportedTypeError, match=r"builtins\.str"):
        find_batch_size(["text"])
    with pytest.raises(UnsupportedTypeError, match="0-d"):
        find_batch_size(torch.tensor(1.0))
    assert ignorant_find_batch_size([]) is None
    assert ignorant_find_batch_size({"a": torch.ones(2)}) == 2


def test_find_device():
    assert find_device({"a": "x", "b": [torch.ones(1, device="meta")]}) == torch.device("meta")
    assert find_device(Batch(torch.ones(1), torch.ones(1))) == torch.device("cpu")
    assert find_device(["no", "tensor"]) is None


def test_concatenate_nested():
    data = [
        {"inputs": [torch.ones(2, 3), torch.zeros(2, 4)], "labels": (torch.arange(2),)},
        {"inputs": [torch.ones(1, 3), torch.zeros(1, 4)], "labels": (torch.arange(1),)},
    ]
    result = concatenate(data)
    assert result["inputs"][0].shape == (3, 3) and result["inputs"][1].shape == (3, 4)
    assert isinstance(result["labels"], tuple) and result["labels"][0].tolist() == [0, 1, 0]
    assert concatenate([torch.ones(2, 1), torch.ones(2, 1)], dim=1).shape == (2, 2)
    assert concatenate(["single"]) == "single"
    with pytest.raises(InvalidArgumentError, match="non-empty list"):
        concatenate([])
    with pytest.raises(UnsupportedTypeError):
        concatenate([{"a": "x"}, {"a": "y"}])


def test_slice_tensors():
    data = {"a": torch.arange(10), "b": [torch.arange(10).reshape(5, 2)]}
    result = slice_tensors(data, slice(1, 3))
    assert result["a"].tolist() == [1, 2] and result["b"][0].shape == (2, 2)
    with pytest.raises(UnsupportedTypeError, match=r"data\['c'\]"):
        slice_tensors({"c": "text"}, slice(0, 1))


def test_convert_to_fp32_and_listify():
    data = {
        "half": torch.ones(2, dtype=torch.float16),
        "bf16": [torch.ones(1, dtype=torch.bfloat16)],
        "int": torch.ones(1, dtype=torch.int64),
        "text": "kept",
    }
    result = convert_to_fp32(data)
    assert result["half"].dtype == torch.float32 and result["bf16"][0].dtype == torch.float32
    assert result["int"].dtype == torch.int64 and result["text"] == "kept"
    assert listify(data) == {"half": [1.0, 1.0], "bf16": [[1.0]], "int": [1], "text": "kept"}
    assert listify(torch.tensor(3)) == 3


def test_convert_outputs_to_fp32_wraps_forward():
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    forward = convert_outputs_to_fp32(model.forward)
    output = forward(torch.ones(1, 2, dtype=torch.bfloat16))
    assert output.dtype == torch.float32
    assert isinstance(forward.__wrapped__, ConvertOutputsToFp32)
    with pytest.raises(pickle.PicklingError, match="unwrap"):
        pickle.dumps(forward.__wrapped__)


def test_send_to_device_moves_every_container():
    data = {
        "list": [torch.ones(1)],
        "tuple": (torch.ones(1), "text"),
        "dataclass": Batch(torch.ones(1), torch.zeros(1)),
        "ordered": collections.OrderedDict(a=torch.ones(1)),
        "number": 3,
    }
    moved = send_to_device(data, "meta")
    assert moved["list"][0].is_meta and moved["tuple"][0].is_meta and moved["tuple"][1] == "text"
    assert isinstance(moved["dataclass"], Batch) and moved["dataclass"].labels.is_meta
    assert isinstance(moved["ordered"], collections.OrderedDict) and moved["ordered"]["a"].is_meta
    assert moved["number"] == 3
    assert not data["list"][0].is_meta


def test_send_to_device_uses_to_method_and_skip_keys():
    encoding = Encoding({"input_ids": torch.ones(2), "labels": torch.ones(2)})
    moved = send_to_device(encoding, torch.device("meta"))
    assert moved.moved_to == torch.device("meta") and moved["input_ids"].is_meta
    skipped = send_to_device(encoding, "meta", skip_keys="labels")
    assert isinstance(skipped, Encoding)
    assert skipped["input_ids"].is_meta and not skipped["labels"].is_meta
    nested = send_to_device(
        {"x": {"keep": torch.ones(1), "go": torch.ones(1)}}, "meta", skip_keys=["keep"]
    )
    assert nested["x"]["go"].is_meta and not nested["x"]["keep"].is_meta
    legacy = send_to_device([LegacyTo()], "meta", non_blocking=True)
    assert legacy[0].device == "meta"
    module = send_to_device(torch.nn.Linear(1, 1), "meta")
    assert module.weight.is_meta
    with pytest.raises(InvalidArgumentError, match="skip_keys"):
        send_to_device({}, "cpu", skip_keys=5)


def test_pad_input_tensors_makes_batches_divisible():
    # (batch size, processes) -> padded size
    for batch_size, processes, expected in [
        (1, 2, 2),
        (3, 2, 4),
        (4, 3, 6),
        (3, 4, 4),
        (4, 6, 6),
        (1, 6, 6),
        (61, 6, 66),
        (8, 4, 8),
    ]:
        batch = torch.rand(batch_size, 4)
        result = pad_input_tensors(batch, batch_size, processes)
        assert result.shape == (expected, 4), (batch_size, processes)
        assert torch.equal(result[:batch_size], batch) and not result[batch_size:].any()
    nested = pad_input_tensors({"a": torch.ones(2, 3, dtype=torch.int64)}, 3, 2, dim=1)
    assert nested["a"].shape == (2, 4) and nested["a"].dtype == torch.int64
    with pytest.raises(InvalidArgumentError, match="num_processes"):
        pad_input_tensors(torch.ones(2), 2, 0)
    with pytest.raises(InvalidArgumentError, match="more than the padded size"):
        pad_input_tensors(torch.ones(9), 2, 2)


@pytest.mark.cuda
def test_send_to_device_cuda_non_blocking():
    data = {"a": torch.ones(4).pin_memory(), "b": [torch.zeros(2)]}
    moved = send_to_device(data, "cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert moved["a"].is_cuda and moved["b"][0].is_cuda
    assert send_to_device(moved, "cpu")["a"].device.type == "cpu"
