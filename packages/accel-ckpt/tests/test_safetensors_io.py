import os
import zlib

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from accel_ckpt import CorruptCheckpointError, direct_io, safetensors_io
from accel_ckpt.safetensors_io import read_header, read_safetensors, write_safetensors


def assorted() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "f32": torch.randn(3, 5),
        "f64": torch.randn(7, dtype=torch.float64),
        "f16": torch.randn(2, 3).half(),
        "bf16": torch.randn(9).bfloat16(),
        "i64": torch.arange(5),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "u8": torch.tensor([255], dtype=torch.uint8),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(4, 6).t(),
    }


def test_round_trip_and_interop_with_the_safetensors_library(tmp_path):
    tensors = assorted()
    record = write_safetensors(tmp_path / "a.safetensors", tensors, {"note": "hi"})
    data = (tmp_path / "a.safetensors").read_bytes()
    assert record.size == len(data) and record.crc32 == zlib.crc32(data)
    theirs = load_file(tmp_path / "a.safetensors")
    assert theirs.keys() == tensors.keys()
    assert all(torch.equal(theirs[k], tensors[k]) for k in tensors)
    with safe_open(tmp_path / "a.safetensors", "pt") as handle:
        assert handle.metadata() == {"note": "hi"}
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "b.safetensors")
    ours = read_safetensors(tmp_path / "b.safetensors")
    assert all(torch.equal(ours.tensors[k], tensors[k]) for k in tensors)
    assert all(ours.tensors[k].dtype == tensors[k].dtype for k in tensors)


def test_reads_into_matching_targets_in_place(tmp_path):
    tensors = assorted()
    record = write_safetensors(tmp_path / "a.safetensors", tensors)
    target = torch.zeros(3, 5)
    wrong_shape = torch.zeros(5, 3)
    loaded = read_safetensors(
        tmp_path / "a.safetensors", targets={"f32": target, "f64": wrong_shape}, expected=record
    )
    assert loaded.direct == {"f32"}
    assert loaded.tensors["f32"] is target and torch.equal(target, tensors["f32"])
    assert torch.equal(loaded.tensors["f64"], tensors["f64"])


@pytest.mark.parametrize("o_direct", [True, False])
def test_direct_io_path_with_unaligned_tail(tmp_path, monkeypatch, o_direct):
    if not o_direct:  # as on file systems or platforms without O_DIRECT
        monkeypatch.setattr(direct_io, "_O_DIRECT", 0)
    monkeypatch.setattr(safetensors_io, "DIRECT_IO_MIN_BYTES", 1)
    monkeypatch.setattr(direct_io, "BUFFER_SIZE", 8192)
    tensors = {f"t{i}": torch.randn(1000 + i) for i in range(5)}
    tensors["tail"] = torch.arange(3, dtype=torch.int8)
    record = write_safetensors(tmp_path / "d.safetensors", tensors)
    data = (tmp_path / "d.safetensors").read_bytes()
    assert (record.size, record.crc32) == (len(data), zlib.crc32(data))
    theirs = load_file(tmp_path / "d.safetensors")
    assert all(torch.equal(theirs[k], tensors[k]) for k in tensors)


def test_damage_is_detected_and_names_the_file(tmp_path):
    path = tmp_path / "a.safetensors"
    record = write_safetensors(path, assorted())
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    read_safetensors(path)  # structurally fine: only the checksum can tell
    with pytest.raises(CorruptCheckpointError, match=r"a\.safetensors.*CRC-32"):
        read_safetensors(path, expected=record)
    path.write_bytes(bytes(data[:-10]))
    with pytest.raises(CorruptCheckpointError, match=r"a\.safetensors"):
        read_safetensors(path)
    with pytest.raises(CorruptCheckpointError, match="manifest says"):
        read_safetensors(path, expected=record)
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{abc}")
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        read_header(path)
    path.write_bytes(b"12")
    with pytest.raises(CorruptCheckpointError, match="shorter than"):
        read_header(path)


def test_write_replaces_and_is_fsynced(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"old content that is longer than the new file" * 100)
    write_safetensors(path, {"a": torch.ones(2)})
    assert calls
    assert torch.equal(load_file(path)["a"], torch.ones(2))
