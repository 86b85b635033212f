import collections
import json

import numpy as np
import pytest
import torch
from ckpt_helpers import same

from accel_ckpt import UnsupportedValueError, load, save
from accel_ckpt.tree_codec import decode_tree, encode_tree


def test_round_trip_of_plain_structures():
    shared = torch.arange(4)
    value = {
        "none": None,
        "flags": [True, False],
        "numbers": [1, -(2**70), 0.1, float("inf"), float("-inf")],
        "text": "ünïcode",
        "tuple": (1, (2, "x")),
        "int_keys": {0: "a", 5: {"b": 2}},
        "dollar": {"$tensor": "not a tag"},
        "ordered": collections.OrderedDict([("z", 1), ("a", 2)]),
        "tensors": [shared, shared, torch.randn(2, 2).bfloat16()],
        "dtype": torch.float16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
        "bytes": b"\x00\x01",
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "np_scalar": np.float32(1.25),
    }
    tree, tensors = encode_tree(value, "test")
    json.dumps(tree)
    back = decode_tree(json.loads(json.dumps(tree)), tensors, "test")
    assert same(
        {k: v for k, v in back.items() if k not in ("array", "np_scalar")},
        {k: v for k, v in value.items() if k not in ("array", "np_scalar")},
    )
    assert back["tensors"][0] is back["tensors"][1]
    assert isinstance(back["ordered"], collections.OrderedDict)
    assert back["array"].dtype == np.uint32 and (back["array"] == value["array"]).all()
    assert back["np_scalar"] == np.float32(1.25) and back["np_scalar"].dtype == np.float32
    assert back["numbers"][2] == 0.1


def test_unsupported_values_name_the_path_and_the_fix():
    class Opaque:
        pass

    with pytest.raises(
        UnsupportedValueError, match=r"scheduler 0: lambdas.1 is a Opaque.*allow_pickle=True"
    ):
        encode_tree({"lambdas": [None, Opaque()]}, "scheduler 0")


def test_save_and_load_helpers(tmp_path):
    tensors = {"w": torch.randn(3), "b": torch.zeros(2)}
    save(tensors, tmp_path / "w.safetensors", safe_serialization=True, is_main_process=True)
    assert same(load(tmp_path / "w.safetensors"), tensors)
    nested = {"step": 3, "moments": [torch.ones(2)], "pair": (1, 2)}
    save(nested, tmp_path / "n.safetensors", safe_serialization=True, is_main_process=True)
    assert same(load(tmp_path / "n.safetensors"), nested)
    save(nested, tmp_path / "n.pt", is_main_process=True)
    assert same(load(tmp_path / "n.pt"), nested)
    save({"x": 1}, tmp_path / "skip.pt", is_main_process=False)
    assert not (tmp_path / "skip.pt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
