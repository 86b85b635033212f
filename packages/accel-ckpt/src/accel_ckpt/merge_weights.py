"""Merge a sharded (``torch.distributed.checkpoint``) model checkpoint into plain weight files.

No process group is started: every tensor is allocated whole and filled from the shards that
each rank wrote, then written as safetensors (sharded with an index above ``max_shard_size``).

Example:
    >>> from accel_ckpt.merge_weights import merge_weights
    >>> merge_weights("ckpt/checkpoint_3", "merged")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from accel_ckpt.containment import check_dcp_paths, resolve_inside
from accel_ckpt.errors import CheckpointNotFoundError
from accel_ckpt.model_io import save_model
from accel_state.torch_compat import local_dcp_options

PathLike = str | os.PathLike[str]
DCP_METADATA = ".metadata"
MODEL_PREFIX = "model."
FULL_MODEL_FILE = "model.safetensors"
FULL_STATE_PREFIX = "fsdp_model_"


def sharded_model_folders(checkpoint_dir: PathLike) -> dict[str, Path]:
    """The sharded model states in ``checkpoint_dir``, by subfolder name.

    ``checkpoint_dir`` is either one ``torch.distributed.checkpoint`` folder (holding
    ``.metadata``) or an accel checkpoint holding such folders (``fsdp_model_0``, ...).

    Raises:
        CheckpointNotFoundError: The folder is missing or holds no sharded model state.
    """
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint_dir={os.fspath(checkpoint_dir)!r} is not a folder; pass the folder "
            "that save_state wrote (or one of its fsdp_model_<i> subfolders)."
        )
    if _is_model_state(folder):
        return {folder.name: folder}
    found = {
        child.name: resolve_inside(folder, child.name, f"merge-weights input {folder}")
        for child in sorted(folder.iterdir())
        if _is_model_state(child)
    }
    if not found:
        raise CheckpointNotFoundError(
            f"checkpoint_dir={os.fspath(checkpoint_dir)!r} holds no sharded model state (no "
            f"{DCP_METADATA} file in it or in a subfolder); it must be a checkpoint saved with "
            "FSDP's SHARDED_STATE_DICT or FULL_STATE_DICT."
        )
    return found


def _is_model_state(folder: Path) -> bool:
    """A ``torch.distributed.checkpoint`` folder, or a full FSDP state (``fsdp_model_<i>``)."""
    if not folder.is_dir():
        return False
    if (folder / DCP_METADATA).is_file():
        return True
    return folder.name.startswith(FULL_STATE_PREFIX) and (folder / FULL_MODEL_FILE).is_file()


def load_sharded_model(folder: PathLike) -> dict[str, torch.Tensor]:
    """The whole model weights stored in one sharded folder, as full CPU tensors."""
    path = Path(folder)
    if (path / FULL_MODEL_FILE).is_file():
        from safetensors.torch import load_file

        return load_file(str(resolve_inside(path, FULL_MODEL_FILE, f"merge-weights input {path}")))
    check_dcp_paths(path)
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    from accel_ckpt.dcp_planning import ScalableLoadPlanner

    reader = FileSystemReader(str(path))
    metadata = reader.read_metadata()
    targets: dict[str, torch.Tensor] = {}
    for key, entry in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(entry, TensorStorageMetadata):
            targets[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    if not targets:
        raise CheckpointNotFoundError(
            f"{os.fspath(folder)!r} holds no model tensors (no '{MODEL_PREFIX}*' entries)."
        )
    load(targets, storage_reader=reader, planner=ScalableLoadPlanner(), **local_dcp_options())
    return {key.removeprefix(MODEL_PREFIX): tensor for key, tensor in targets.items()}


def merge_weights(
    checkpoint_dir: PathLike,
    output_dir: PathLike,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[Path]:
    """Write the full weights of a sharded checkpoint as ``model.safetensors`` (or shards + index).

    With several sharded models in the checkpoint, each goes to ``output_dir/<subfolder>``.

    Returns:
        The files written.

    Raises:
        CheckpointNotFoundError: No sharded model state in ``checkpoint_dir``.
    """
    folders = sharded_model_folders(checkpoint_dir)
    written: list[Path] = []
    for name, folder in folders.items():
        target = Path(output_dir) if len(folders) == 1 else Path(output_dir) / name
        written += save_model(
            torch.nn.Module(),
            target,
            max_shard_size=max_shard_size,
            safe_serialization=safe_serialization,
            state_dict=load_sharded_model(folder),
            is_main_process=True,
        )
    return written
