"""Unit tests for the apply-over-structure helpers (no process group)."""

import collections
import dataclasses
import types
from typing import NamedTuple

import pytest
import torch
from _accel_ops_workers import ReadOnlyMapping

from accel_ops import (
    AccelOpsError,
    TensorInformation,
    UnsupportedTypeError,
    get_data_structure,
    get_shape,
    honor_type,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    recursively_apply,
)


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class SubPoint(Point):
    pass


@dataclasses.dataclass
class Output:
    loss: torch.Tensor
    extras: list


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenOutput:
    logits: torch.Tensor
    computed: int = dataclasses.field(default=7, init=False)

    def __post_init__(self):
        object.__setattr__(self, "computed", self.computed + 1)  # must not run twice


class NoDictConstructor(collections.UserDict):
    def __init__(self, data, tag):
        super().__init__(data)
        self.tag = tag


def double(tensor):
    return tensor * 2


def every_container():
    t = torch.ones(2)
    return {
        "list": [t, t],
        "tuple": (t, (t,)),
        "namedtuple": Point(t, t),
        "namedtuple_subclass": SubPoint(t, t),
        "dataclass": Output(loss=t, extras=[t]),
        "frozen_slots_dataclass": FrozenOutput(logits=t),
        "ordered": collections.OrderedDict(a=t),
        "defaultdict": collections.defaultdict(list, a=t),
        "mapping": ReadOnlyMapping({"a": t}),
        "proxy": types.MappingProxyType({"a": t}),
        "userdict": NoDictConstructor({"a": t}, "tag"),
        "return_types": torch.max(torch.ones(2, 2), dim=1),
        "size": torch.Size([1, 2]),
        "string": "kept",
        "none": None,
    }


def test_recursively_apply_keeps_every_container_type():
    data = every_container()
    result = recursively_apply(double, data)
    assert type(result) is dict and list(result) == list(data)
    for key, value in data.items():
        assert type(result[key]) is type(value), key
    assert torch.equal(result["list"][0], torch.full((2,), 2.0))
    assert torch.equal(result["tuple"][1][0], torch.full((2,), 2.0))
    assert result["namedtuple"].y.sum() == 4
    assert torch.equal(result["dataclass"].extras[0], torch.full((2,), 2.0))
    frozen = result["frozen_slots_dataclass"]
    assert torch.equal(frozen.logits, torch.full((2,), 2.0))
    assert frozen.computed == 8  # __post_init__ did not run again
    assert result["defaultdict"].default_factory is list
    assert result["userdict"].tag == "tag" and result["userdict"]["a"].sum() == 4
    assert data["userdict"]["a"].sum() == 2  # the copy did not share storage
    assert torch.equal(result["return_types"].values, torch.full((2,), 2.0))
    assert result["size"] == torch.Size([1, 2])
    assert result["string"] == "kept" and result["none"] is None
    # The input is untouched.
    assert torch.equal(data["list"][0], torch.ones(2))


def test_recursively_apply_passes_args_kwargs_and_test_type():
    def add(tensor, amount, *, factor):
        return (tensor + amount) * factor

    result = recursively_apply(add, [torch.zeros(1), 3], 1, factor=2)
    assert result[0].item() == 2 and result[1] == 3
    ints = recursively_apply(
        lambda x: x + 1, {"a": 1, "b": [2]}, test_type=lambda x: isinstance(x, int)
    )
    assert ints == {"a": 2, "b": [3]}


def test_recursively_apply_error_names_type_and_path():
    data = {"inputs": [torch.ones(1), Point(torch.ones(1), "oops")]}
    with pytest.raises(UnsupportedTypeError) as info:
        recursively_apply(double, data, error_on_other_type=True)
    message = str(info.value)
    assert "builtins.str" in message
    assert "data['inputs'][1].y" in message
    assert "is_torch_tensor" in message
    assert isinstance(info.value, TypeError) and isinstance(info.value, AccelOpsError)


def test_unsupported_type_error_pickles():
    import pickle

    error = UnsupportedTypeError("gather", str, "tensors", "hint", path=["[0]"])
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)


def test_honor_type_and_is_namedtuple():
    assert honor_type((1, 2), iter([3, 4])) == (3, 4)
    assert honor_type([1], (x for x in [5])) == [5]
    point = honor_type(Point(1, 2), iter([3, 4]))
    assert isinstance(point, Point) and point.y == 4
    assert is_namedtuple(Point(1, 2)) and is_namedtuple(SubPoint(1, 2))
    assert is_namedtuple(collections.namedtuple("P", "a b")(1, 2))
    assert not is_namedtuple((1, 2)) and not is_namedtuple("hey") and not is_namedtuple(object())


def test_type_predicates():
    assert is_torch_tensor(torch.ones(1)) and not is_torch_tensor([1])
    assert is_torch_tensor(torch.nn.Parameter(torch.ones(1)))
    info = TensorInformation(torch.Size([2]), torch.int64)
    assert is_tensor_information(info) and not is_tensor_information(torch.ones(1))


def test_data_structure_round_trip_and_shapes():
    data = {"a": torch.ones(2, 3, dtype=torch.bfloat16), "b": [torch.zeros(4, dtype=torch.bool)]}
    structure = get_data_structure(data)
    assert structure["a"] == TensorInformation(torch.Size([2, 3]), torch.bfloat16)
    rebuilt = initialize_tensors(structure)
    assert rebuilt["a"].shape == (2, 3) and rebuilt["a"].dtype == torch.bfloat16
    assert rebuilt["b"][0].dtype == torch.bool
    assert initialize_tensors(structure, device="meta")["a"].is_meta
    assert get_shape(data) == {"a": [2, 3], "b": [[4]]}


def test_mapping_that_cannot_be_rebuilt_gives_clear_error():
    class Stubborn(collections.abc.Mapping):
        def __init__(self, required_a, required_b):
            self._data = {"a": required_a}

        def __getitem__(self, key):
            return self._data[key]

        def __iter__(self):
            return iter(self._data)

        def __len__(self):
            return 1

    with pytest.raises(UnsupportedTypeError, match="constructor that accepts a dict"):
        recursively_apply(double, Stubborn(torch.ones(1), None))


def test_predicates_take_accelerates_keyword_names():
    from accel_ops.structures import TensorInformation, is_tensor_information, is_torch_tensor

    assert is_torch_tensor(tensor=torch.ones(1))
    assert not is_torch_tensor(tensor=[1.0])
    info = TensorInformation(shape=torch.Size([2]), dtype=torch.float32)
    assert is_tensor_information(tensor_info=info)
    assert not is_tensor_information(tensor_info=torch.ones(2))
