"""A checkpoint never reaches outside its folder, whatever its files name.

For every entry point that follows names read from a file (the manifest of ``load_state``, a
shard index, the offload index of big-model loading, a ``torch.distributed.checkpoint``
folder given to merge-weights) or given when saving (sharded-state reports, files left by
hooks, offloaded weight names), a ``../`` name, an absolute name and a symlink pointing outside
are each refused with :class:`PathEscapeError` naming the entry, and nothing outside is read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from accel_ckpt import (
    PathEscapeError,
    load_checkpoint_in_model,
    load_state,
    save_model,
    save_state,
)
from accel_ckpt.big_modeling import OffloadedWeightsLoader, offload_state_dict
from accel_ckpt.big_modeling.offload import offload_weight
from accel_ckpt.checksum import crc32_of_file
from accel_ckpt.merge_weights import merge_weights
from accel_state.torch_compat import local_dcp_options

KINDS = ["dotdot", "absolute", "symlink"]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def planted(tmp_path: Path) -> Path:
    """A weights file outside every checkpoint folder: all zeros, so loading it would show."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    path = outside / "model.safetensors"
    save_file({name: torch.zeros_like(t) for name, t in model().state_dict().items()}, str(path))
    return path


def escaping_name(kind: str, folder: Path, target: Path, inside_name: str) -> str:
    """The entry naming ``target`` from ``folder``; for ``symlink`` the link is made here."""
    if kind == "dotdot":
        return os.path.relpath(target, folder)
    if kind == "absolute":
        return str(target)
    link = folder / inside_name
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(target)
    return inside_name


def unchanged(module: torch.nn.Module) -> bool:
    return all(
        torch.equal(a, b)
        for a, b in zip(module.state_dict().values(), model().state_dict().values(), strict=True)
    )


@pytest.mark.parametrize("kind", KINDS)
def test_load_state_refuses_a_manifest_naming_a_file_outside(tmp_path, kind):
    folder = save_state(tmp_path / "ckpt", models=[model()])
    target = planted(tmp_path)
    manifest_path = folder / "accel_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    name = escaping_name(kind, folder, target, "model.safetensors")
    if kind != "symlink":  # the manifest itself names the outside file, size and CRC matching
        size, crc = crc32_of_file(str(target))
        manifest["files"].pop("model.safetensors")
        manifest["files"][name] = {"size": size, "crc32": f"{crc:08x}"}
        manifest["contents"]["models"] = [name]
        (folder / "model.safetensors").unlink()
        manifest_path.write_text(json.dumps(manifest))
    fresh = model()
    with pytest.raises(PathEscapeError) as raised:
        load_state(folder, models=[fresh])
    assert repr(name) in str(raised.value) and "accel_manifest.json" in str(raised.value)
    assert unchanged(fresh)


@pytest.mark.parametrize("kind", KINDS)
def test_a_shard_index_naming_a_file_outside_is_refused(tmp_path, kind):
    folder = tmp_path / "weights"
    save_model(model(), folder, max_shard_size="40B")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    target = planted(tmp_path)
    first = sorted(set(index["weight_map"].values()))[0]
    name = escaping_name(kind, folder, target, first)
    index["weight_map"] = {
        key: (name if file == first else file) for key, file in index["weight_map"].items()
    }
    index_path.write_text(json.dumps(index))
    fresh = model()
    with pytest.raises(PathEscapeError, match="shard index") as raised:
        load_checkpoint_in_model(fresh, folder)
    assert repr(name) in str(raised.value)
    assert unchanged(fresh)


@pytest.mark.parametrize("kind", KINDS)
def test_an_offload_index_naming_a_file_outside_is_refused(tmp_path, kind):
    folder = tmp_path / "offload"
    offload_state_dict(folder, model().state_dict())
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(folder / "0.weight.dat", outside / "secret.dat")
    index = json.loads((folder / "index.json").read_text())
    entry = index.pop("0.weight")
    if kind == "symlink":
        escaping_name(kind, folder, outside / "secret.dat", "0.weight.dat")
        index["0.weight"] = entry
        name = "0.weight.dat"
    else:
        name = escaping_name(kind, folder, outside / "secret", "unused") + ".dat"
        index[name.removesuffix(".dat")] = entry
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(PathEscapeError, match="offload index") as raised:
        OffloadedWeightsLoader(save_folder=folder)
    assert repr(name) in str(raised.value)


def _dcp_model_folder(tmp_path: Path) -> Path:
    from torch.distributed.checkpoint.state_dict_saver import save

    folder = tmp_path / "checkpoint_0" / "fsdp_model_0"
    save({"model": model().state_dict()}, checkpoint_id=folder, **local_dcp_options())
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_merge_weights_refuses_shards_named_outside(tmp_path, kind):
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    folder = _dcp_model_folder(tmp_path)
    shard = sorted(folder.glob("*.distcp"))[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / shard.name
    shutil.copy(shard, target)
    name = escaping_name(kind, folder, target, shard.name)
    if kind != "symlink":
        metadata = FileSystemReader(str(folder)).read_metadata()
        metadata.storage_data = {
            key: dataclasses.replace(info, relative_path=name)
            for key, info in metadata.storage_data.items()
        }
        (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(PathEscapeError, match=r"\.metadata") as raised:
        merge_weights(tmp_path / "checkpoint_0", tmp_path / "merged")
    assert repr(name) in str(raised.value)
    assert not (tmp_path / "merged").exists()


def test_merge_weights_refuses_a_model_folder_linked_from_outside(tmp_path):
    real = _dcp_model_folder(tmp_path / "elsewhere")
    checkpoint = tmp_path / "checkpoint_1"
    checkpoint.mkdir()
    (checkpoint / "fsdp_model_0").symlink_to(real, target_is_directory=True)
    with pytest.raises(PathEscapeError, match="merge-weights input") as raised:
        merge_weights(checkpoint, tmp_path / "merged")
    assert "'fsdp_model_0'" in str(raised.value)


class _Shards:
    """A sharded state whose save() reports (or leaves behind) a name of the test's choosing."""

    name = "shards"

    def __init__(self, kind: str, outside: Path) -> None:
        self.kind, self.outside = kind, outside

    def save(self, folder: Path) -> dict[str, tuple[int, int]] | None:
        (folder / "part.bin").write_bytes(b"1234")
        if self.kind == "symlink":
            (folder / "link.bin").symlink_to(self.outside)
            return None
        name = "../escape.bin" if self.kind == "dotdot" else str(self.outside)
        return {name: (4, 0)}

    def load(self, folder: Path) -> None:
        raise AssertionError("never loaded")


@pytest.mark.parametrize("kind", KINDS)
def test_saving_refuses_names_that_leave_the_checkpoint(tmp_path, kind):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"private")
    with pytest.raises(PathEscapeError) as raised:
        save_state(tmp_path / "ckpt", models=[model()], sharded_states=[_Shards(kind, outside)])
    expected = {"dotdot": "'../escape.bin'", "absolute": repr(str(outside)), "symlink": "link.bin"}
    assert expected[kind] in str(raised.value)
    assert not (tmp_path / "ckpt").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["outside.bin"]  # no staging left


@pytest.mark.parametrize("name", ["../up", "/abs/weight", "..\\windows"])
def test_offloaded_weight_names_stay_in_the_offload_folder(tmp_path, name):
    with pytest.raises(PathEscapeError, match="weight_name"):
        offload_weight(torch.ones(2), name, tmp_path / "offload")
    assert not (tmp_path / "up.dat").exists()
