import json
import logging

import pytest
import torch
from ckpt_helpers import TiedLM, mlp, same
from safetensors.torch import load_file
from torch import nn

from accel_ckpt import (
    CheckpointNotFoundError,
    StateDictMismatchError,
    load_checkpoint_in_model,
    save_model,
    unwrap_model,
)


def model_pair(seed: int = 0) -> tuple[TiedLM, TiedLM]:
    torch.manual_seed(seed)
    source = TiedLM()
    torch.manual_seed(seed + 100)
    return source, TiedLM()


def test_single_safetensors_file_with_tied_weights(tmp_path):
    source, target = model_pair()
    written = save_model(source, tmp_path, is_main_process=True)
    assert [p.name for p in written] == ["model.safetensors"]
    stored = load_file(tmp_path / "model.safetensors")  # the reference library reads it
    assert "head.weight" not in stored and "embed.weight" in stored
    keys = load_checkpoint_in_model(target, tmp_path, strict=True)
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    assert same(target.state_dict(), source.state_dict())
    assert target.head.weight is target.embed.weight


def test_sharded_safetensors_with_index(tmp_path):
    source, target = model_pair(1)
    written = save_model(source, tmp_path, max_shard_size="2KB", is_main_process=True)
    names = sorted(p.name for p in written)
    count = len(names) - 1
    assert count > 2
    assert names[-1] == "model.safetensors.index.json"
    assert names[0] == f"model-00001-of-{count:05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    expected_total = sum(
        t.numel() * t.element_size() for k, t in source.state_dict().items() if k != "head.weight"
    )
    assert index["metadata"]["total_size"] == expected_total
    assert index["metadata"]["accel_aliases"] == {"head.weight": "embed.weight"}
    assert set(index["weight_map"]) == set(source.state_dict()) - {"head.weight"}
    assert set(index["weight_map"].values()) == set(names[:-1])
    load_checkpoint_in_model(target, tmp_path / "model.safetensors.index.json", strict=True)
    assert same(target.state_dict(), source.state_dict())
    assert target.head.weight is target.embed.weight


@pytest.mark.parametrize("shard", ["10GB", 3000])
def test_pickled_bin_round_trip(tmp_path, shard):
    source, target = model_pair(2)
    written = save_model(
        source, tmp_path, max_shard_size=shard, safe_serialization=False, is_main_process=True
    )
    names = {p.name for p in written}
    if shard == "10GB":
        assert names == {"pytorch_model.bin"}
    else:
        assert "pytorch_model.bin.index.json" in names and "pytorch_model-00001-of-" in min(names)
    load_checkpoint_in_model(target, tmp_path, strict=True)
    assert same(target.state_dict(), source.state_dict())
    assert target.head.weight is target.embed.weight


def test_resaving_removes_stale_shards(tmp_path):
    source, _ = model_pair()
    save_model(source, tmp_path, max_shard_size="2KB", is_main_process=True)
    (tmp_path / "config.json").write_text("{}")
    save_model(source, tmp_path, is_main_process=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]


def test_meta_model_with_dtype_and_device_map(tmp_path):
    source, _ = model_pair(3)
    save_model(source, tmp_path, is_main_process=True)
    target = TiedLM().to("meta")  # (building under torch.device("meta") imports dynamo: slow)
    target.head.weight = target.embed.weight
    load_checkpoint_in_model(
        target,
        tmp_path,
        device_map={"": "cpu", "body": torch.device("cpu")},
        dtype=torch.float16,
        keep_in_fp32_modules=["body"],
        strict=True,
    )
    assert target.embed.weight.device.type == "cpu"
    assert target.head.weight is target.embed.weight
    assert target.embed.weight.dtype == torch.float16
    assert target.body[0].weight.dtype == torch.float32
    assert target.position.dtype == torch.int64 and torch.equal(target.position, torch.arange(8))
    assert torch.equal(target.embed.weight, source.embed.weight.half())
    assert torch.equal(target.body[0].weight, source.body[0].weight)


def test_disk_offload_writes_raw_files_and_index(tmp_path):
    source, target = model_pair(4)
    save_model(source, tmp_path / "ckpt", is_main_process=True)
    load_checkpoint_in_model(
        target,
        tmp_path / "ckpt",
        device_map={"": "cpu", "body.0": "disk"},
        offload_folder=tmp_path / "off",
    )
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert set(index) == {"body.0.weight", "body.0.bias"}
    raw = (tmp_path / "off" / "body.0.weight.dat").read_bytes()
    stored = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(
        index["body.0.weight"]["shape"]
    )
    assert torch.equal(stored, source.body[0].weight)
    assert torch.equal(target.embed.weight, source.embed.weight)


def test_strict_reports_missing_and_unexpected_keys(tmp_path, caplog):
    net = mlp()
    save_model(net, tmp_path, is_main_process=True)
    bigger = nn.Sequential(*mlp(), nn.Linear(2, 2))
    with pytest.raises(
        StateDictMismatchError, match=r"missing keys \['5.bias', '5.weight'\]"
    ) as info:
        load_checkpoint_in_model(bigger, tmp_path, strict=True)
    assert info.value.missing_keys == ["5.bias", "5.weight"]
    smaller = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(
        StateDictMismatchError,
        match=r"unexpected keys \['2.bias', '2.weight', '4.bias', '4.weight'\]",
    ):
        load_checkpoint_in_model(smaller, tmp_path, strict=True)
    before = smaller[0].weight.clone()
    with caplog.at_level(logging.WARNING):
        keys = load_checkpoint_in_model(smaller, tmp_path)
    assert keys.unexpected_keys == ["2.bias", "2.weight", "4.bias", "4.weight"]
    assert "not used" in caplog.text
    assert not torch.equal(before, smaller[0].weight)


def test_shape_mismatch_is_refused_before_anything_changes(tmp_path):
    save_model(mlp(width=8), tmp_path, is_main_process=True)
    other = mlp(width=4)
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(
        StateDictMismatchError, match=r"'0.weight': .* has shape \[8, 8\], the model \[4, 4\]"
    ):
        load_checkpoint_in_model(other, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(), strict=True))


def test_missing_checkpoint_and_interrupted_shards(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        load_checkpoint_in_model(mlp(), tmp_path / "nope")
    source, _ = model_pair()
    save_model(source, tmp_path, max_shard_size="2KB", is_main_process=True)
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointNotFoundError, match="interrupted save_model"):
        load_checkpoint_in_model(TiedLM(), tmp_path)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_unwrapping_compile_and_custom(tmp_path):
    net = mlp()
    compiled = torch.compile(net)
    assert unwrap_model(compiled) is net
    save_model(compiled, tmp_path, is_main_process=True)
    assert set(load_file(tmp_path / "model.safetensors")) == set(net.state_dict())
    holder = nn.Module()
    holder.module = net
    assert unwrap_model(holder) is holder  # a plain attribute called module is not a wrapper
    assert unwrap_model(holder, unwrap=lambda m: m.module) is net


class _Parts(nn.Module):
    """Parameters under ``a``, ``keep`` and ``h.0.two``, and a float buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.keep = nn.Linear(2, 2)
        self.h = nn.ModuleList([nn.ModuleDict({"two": nn.Linear(2, 2)})])
        self.register_buffer("scale", torch.ones(2))


def _dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {name: tensor.dtype for name, tensor in model.state_dict().items()}


def test_dtype_without_device_map_keeps_the_model_dtypes_as_accelerate(tmp_path, caplog):
    torch.manual_seed(0)
    source = _Parts()
    save_model(source, tmp_path, is_main_process=True)
    target = _Parts()
    with caplog.at_level(logging.WARNING, logger="accel_ckpt"):
        load_checkpoint_in_model(target, tmp_path, dtype=torch.float16, strict=True)
    assert set(_dtypes(target).values()) == {torch.float32}
    assert same(target.state_dict(), source.state_dict())
    assert "pass device_map={'': device} to cast" in caplog.text
    half = _Parts().half()  # the model's own dtype wins, whatever the file holds
    load_checkpoint_in_model(half, tmp_path, dtype="float32", strict=True)
    assert set(_dtypes(half).values()) == {torch.float16}


def test_keep_in_fp32_modules_applies_to_float16_only(tmp_path):
    torch.manual_seed(0)
    save_model(_Parts(), tmp_path, is_main_process=True)
    fp16 = _Parts()
    load_checkpoint_in_model(
        fp16, tmp_path, device_map={"": "cpu"}, dtype="torch.float16", keep_in_fp32_modules=["keep"]
    )
    assert _dtypes(fp16) == {
        "scale": torch.float16,
        "a.weight": torch.float16,
        "a.bias": torch.float16,
        "keep.weight": torch.float32,
        "keep.bias": torch.float32,
        "h.0.two.weight": torch.float16,
        "h.0.two.bias": torch.float16,
    }
    # Whole dotted components: "wo" would not match "two"; a nested module name matches.
    for keep, kept in (["wo"], False), (["two"], True), (["h.0.two"], True), (["0.tw"], False):
        nested = _Parts()
        load_checkpoint_in_model(
            nested, tmp_path, device_map={"": "cpu"}, dtype=torch.float16, keep_in_fp32_modules=keep
        )
        assert nested.h[0]["two"].weight.dtype == (torch.float32 if kept else torch.float16), keep
        assert nested.keep.weight.dtype == torch.float16
    bf16 = _Parts()
    load_checkpoint_in_model(
        bf16, tmp_path, device_map={"": "cpu"}, dtype=torch.bfloat16, keep_in_fp32_modules=["keep"]
    )
    assert set(_dtypes(bf16).values()) == {torch.bfloat16}
    with pytest.raises(ValueError, match="dtype='float17' is not a torch dtype"):
        load_checkpoint_in_model(_Parts(), tmp_path, dtype="float17")
