"""Weights offloaded to disk: one raw ``<name>.dat`` file per tensor plus ``index.json``.

The layout is Accelerate's: ``index.json`` maps each name to ``{"dtype": "float32", "shape":
[...]}``, and ``<name>.dat`` holds the tensor's bytes. Tensors are read back with one ``readinto``
into a fresh tensor, so nothing stays mapped after the forward pass that needed them.

An entry may instead point into a safetensors file (``{"safetensors_file": path, "weight_name":
name, "dtype": "bfloat16"}``): transformers 5 writes such indexes for weights that stay in the
checkpoint it loads from, instead of copying them. Those are read with ``safe_open`` and cast to
the entry's dtype, as Accelerate's loader does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from accel_ckpt.atomic import atomic_file
from accel_ckpt.containment import check_all_inside, check_relative_name
from accel_ckpt.dtypes import dtype_from_name, dtype_name
from accel_ckpt.errors import CheckpointNotFoundError, CorruptCheckpointError
from accel_ckpt.memory import empty_released, tensor_bytes
from accel_ckpt.safetensors_io import cpu_contiguous

PathLike = str | os.PathLike[str]
INDEX_NAME = "index.json"


def offload_weight(
    weight: torch.Tensor,
    weight_name: str,
    offload_folder: PathLike,
    index: dict[str, dict[str, object]] | None = None,
) -> dict[str, dict[str, object]]:
    """Write ``weight`` to ``offload_folder/<weight_name>.dat`` and record it in ``index``.

    Returns:
        ``index`` (a new dict when none was given) with the entry added.

    """
    folder = Path(offload_folder)
    check_relative_name(f"{weight_name}.dat", f"offload_weight(weight_name={weight_name!r})")
    folder.mkdir(parents=True, exist_ok=True)
    data = cpu_contiguous(weight)
    with atomic_file(folder / f"{weight_name}.dat") as temporary, open(temporary, "wb") as handle:
        handle.write(tensor_bytes(data))
    index = {} if index is None else index
    index[weight_name] = {"dtype": dtype_name(data.dtype), "shape": list(data.shape)}
    return index


def save_offload_index(index: Mapping[str, Mapping[str, object]], offload_folder: PathLike) -> None:
    """Merge ``index`` into ``offload_folder/index.json`` (created when absent)."""
    if not index:
        return
    path = Path(offload_folder) / INDEX_NAME
    merged: dict[str, object] = {}
    if path.exists():
        merged.update(json.loads(path.read_text()))
    merged.update(index)
    with atomic_file(path) as temporary:
        temporary.write_text(json.dumps(merged, indent=2))


def offload_state_dict(save_dir: PathLike, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` with its index."""
    index: dict[str, dict[str, object]] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index)
    save_offload_index(index, save_dir)


def read_offload_index(offload_folder: PathLike) -> dict[str, dict[str, object]]:
    """The ``index.json`` of ``offload_folder`` (empty when there is none)."""
    path = Path(offload_folder) / INDEX_NAME
    if not path.exists():
        return {}
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CorruptCheckpointError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(index, dict):
        raise CorruptCheckpointError(f"{path} does not map tensor names to dtype and shape.")
    check_all_inside(offload_folder, (f"{name}.dat" for name in index), f"offload index {path}")
    return index


def load_offloaded_weight(weight_file: PathLike, weight_info: Mapping[str, object]) -> torch.Tensor:
    """Read one ``.dat`` file into a new CPU tensor of the recorded dtype and shape.

    Raises:
        CheckpointNotFoundError: The file is missing.
        CorruptCheckpointError: Its size does not match the index.

    """
    dtype = dtype_from_name(str(weight_info["dtype"]))
    shape = [int(d) for d in weight_info["shape"]]  # type: ignore[attr-defined]
    tensor = empty_released(shape, dtype)
    view = tensor_bytes(tensor)
    if not os.path.exists(weight_file):
        raise CheckpointNotFoundError(
            f"The offloaded weight {os.fspath(weight_file)} is missing; the offload folder was changed "
            "after loading. Load the checkpoint again."
        )
    with open(weight_file, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size != len(view):
            raise CorruptCheckpointError(
                f"{os.fspath(weight_file)} has {size} bytes but its index says {dtype} {shape} "
                f"({len(view)} bytes). Load the checkpoint again."
            )
        got = 0
        while got < len(view):
            count = handle.readinto(view[got:])
            if not count:
                raise CorruptCheckpointError(f"{os.fspath(weight_file)} ended early.")
            got += count
    return tensor


def load_safetensors_entry(entry: Mapping[str, object], key: str) -> torch.Tensor:
    """Read an index entry that points into a safetensors file (on the CPU, in its dtype).

    Raises:
        CheckpointNotFoundError: The file is missing.
        CorruptCheckpointError: The file has no tensor of that name.

    """
    from safetensors import safe_open

    path = os.fspath(str(entry["safetensors_file"]))
    name = str(entry.get("weight_name") or key)
    if not os.path.exists(path):
        raise CheckpointNotFoundError(
            f"The offloaded weight {key!r} points into {path}, which is missing; the checkpoint "
            "was moved after loading. Load it again."
        )
    with safe_open(path, framework="pt", device="cpu") as handle:
        if name not in handle.keys():  # noqa: SIM118 - safe_open has keys(), not __contains__
            raise CorruptCheckpointError(
                f"The offload index maps {key!r} to {name!r} in {path}, which has no such tensor."
            )
        tensor: torch.Tensor = handle.get_tensor(name)
    dtype = entry.get("dtype")
    return tensor.to(dtype_from_name(str(dtype))) if dtype else tensor


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """A read-only mapping over tensors kept in memory (``state_dict``) and on disk.

    Disk tensors are read on every access (nothing is cached), so they only take memory while
    the caller holds them.

    Args:
        state_dict: Tensors held in (CPU) memory.
        save_folder: The offload folder; its ``index.json`` is read unless ``index`` is given.
        index: Name -> ``{"dtype", "shape"}`` of the disk tensors (or ``{"safetensors_file",
            "weight_name", "dtype"}`` for tensors read from a safetensors file).
        device: Move tensors read from disk there (default: stay on the CPU).

    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: PathLike | None = None,
        index: Mapping[str, Mapping[str, object]] | None = None,
        device: torch.device | str | int | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise CheckpointNotFoundError(
                "OffloadedWeightsLoader needs state_dict= or save_folder= (or both)."
            )
        self.state_dict = dict(state_dict or {})
        self.save_folder = Path(save_folder) if save_folder is not None else None
        if index is None and self.save_folder is not None:
            index = read_offload_index(self.save_folder)
        elif index is not None and self.save_folder is not None:
            check_all_inside(
                self.save_folder, (f"{name}.dat" for name in index), "the offload index given"
            )
        self.index = dict(index or {})
        self.device = device
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        entry = self.index.get(key)
        if entry is not None and entry.get("safetensors_file") is not None:
            tensor = load_safetensors_entry(entry, key)
        elif entry is not None and self.save_folder is not None:
            tensor = load_offloaded_weight(self.save_folder / f"{key}.dat", entry)
        else:
            raise KeyError(key)
        return tensor.to(self.device) if self.device is not None else tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


class PrefixedDataset(Mapping[str, torch.Tensor]):
    """The entries of ``dataset`` whose keys start with ``prefix``, without the prefix."""

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter(k[len(self.prefix) :] for k in self.dataset if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return f"{self.prefix}{key}" in self.dataset
