"""The checksumming ``torch.distributed.checkpoint`` writer, in one process."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint import load, save

from accel_ckpt.checksum import crc32_of_file
from accel_ckpt.dcp_writer import _ChecksummingFileSystem, checksummed_writer
from accel_state.torch_compat import local_dcp_options


def test_records_match_the_files_on_disk_and_the_checkpoint_loads(tmp_path):
    state = {"weight": torch.randn(300, 70), "step": torch.tensor(7), "extra": {"lr": 0.5}}
    writer = checksummed_writer(tmp_path)
    save(state, storage_writer=writer, **local_dcp_options())
    on_disk = {path.name: crc32_of_file(str(path)) for path in tmp_path.iterdir()}
    assert writer.records == on_disk  # .metadata included (torch writes it as .tmp, renames)
    assert ".metadata" in on_disk and not any(name.endswith(".tmp") for name in on_disk)
    restored = {"weight": torch.zeros(300, 70), "step": torch.tensor(0), "extra": {"lr": 0.0}}
    load(restored, checkpoint_id=tmp_path, **local_dcp_options())
    assert torch.equal(restored["weight"], state["weight"]) and restored["step"].item() == 7


def test_a_file_that_was_seeked_in_or_removed_is_not_reported(tmp_path):
    files = _ChecksummingFileSystem(tmp_path)
    with files.create_stream(tmp_path / "plain.bin", "wb") as stream:
        stream.write(b"abc")
        stream.write(memoryview(b"defgh"))
    with files.create_stream(tmp_path / "rewound.bin", "wb") as stream:
        stream.write(b"abcdef")
        stream.seek(0)
        stream.write(b"X")
    with files.create_stream(tmp_path / "gone.bin", "wb") as stream:
        stream.write(b"x")
    files.rm_file(tmp_path / "gone.bin")
    assert files.records == {"plain.bin": crc32_of_file(str(tmp_path / "plain.bin"))}
    with files.create_stream(tmp_path / "plain.bin", "rb") as stream:  # reading records nothing
        assert stream.read() == b"abcdefgh"
    assert list(files.records) == ["plain.bin"]


def test_a_writer_reset_to_another_folder_reports_that_folders_files(tmp_path):
    writer = checksummed_writer(tmp_path / "first")
    save({"a": torch.ones(3)}, storage_writer=writer, **local_dcp_options())
    save(
        {"b": torch.zeros(5)},
        storage_writer=writer,
        checkpoint_id=tmp_path / "second",
        **local_dcp_options(),
    )
    second = tmp_path / "second"
    assert writer.records == {p.name: crc32_of_file(str(p)) for p in second.iterdir()}
