"""``save(obj, path)`` and ``load(path)``: one file, written once, atomically, loaded safely."""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from accel_ckpt.atomic import atomic_file
from accel_ckpt.errors import CheckpointNotFoundError
from accel_ckpt.object_io import decode_state, save_state_file
from accel_ckpt.pickle_io import load_pickled, save_pickled
from accel_ckpt.safetensors_io import MAX_HEADER_SIZE, read_safetensors, write_safetensors

PathLike = str | os.PathLike[str]


def _writes_here(save_on_each_node: bool) -> bool:
    from accel_state.partial_state import PartialState

    state = PartialState()
    return state.is_local_main_process if save_on_each_node else state.is_main_process


def save(
    obj: Any,
    f: PathLike,
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
    *,
    is_main_process: bool | None = None,
) -> None:
    """Write ``obj`` to ``f`` from the main process only (each machine's with ``save_on_each_node``).

    The file is written under a temporary name, fsynced and renamed, so ``f`` is always either
    the previous file or the complete new one.

    Args:
        obj: What to save. With ``safe_serialization`` a dict of tensors becomes a plain
            safetensors file; other tensors/containers/numbers a safetensors file with a JSON
            structure (see :mod:`accel_ckpt.tree_codec`). Without it, ``torch.save`` (pickle).
        f: Destination file.
        save_on_each_node: Write once per machine instead of once per job.
        safe_serialization: Use safetensors instead of pickle.
        is_main_process: Whether this process writes (default from ``PartialState``).

    """
    writes = _writes_here(save_on_each_node) if is_main_process is None else is_main_process
    if not writes:
        return
    path = Path(f)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as temporary:
        if not safe_serialization:
            save_pickled(obj, temporary)
        elif isinstance(obj, Mapping) and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
        ):
            from accel_ckpt.big_modeling.model_helpers import clean_state_dict_for_safetensors

            # Tensors sharing storage (tied weights) are written once, with a warning.
            write_safetensors(
                temporary, clean_state_dict_for_safetensors(dict(obj)), {"format": "pt"}
            )
        else:
            save_state_file(temporary, obj, f"save({os.fspath(f)!r})")


def is_safetensors_file(path: PathLike) -> bool:
    """Whether ``path`` starts like a safetensors file (length prefix, then ``{``)."""
    with open(path, "rb") as handle:
        head = handle.read(9)
        size = os.fstat(handle.fileno()).st_size
    if len(head) < 9:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return head[8:9] == b"{" and 0 < length <= MAX_HEADER_SIZE and 8 + length <= size


def load(
    f: PathLike,
    map_location: Any = None,
    *,
    allow_pickle: bool = False,
    safe_globals: Sequence[Any] = (),
) -> Any:
    """Load a file written by :func:`save` (or any safetensors / ``torch.save`` file) safely.

    Pickled files go through PyTorch's restricted unpickler; one that needs other code raises
    :class:`accel_ckpt.UnsafeCheckpointError` without running it, unless ``allow_pickle=True``.

    Args:
        f: The file.
        map_location: Device for the loaded tensors (default: where ``torch.load`` puts them,
            the CPU for safetensors).
        allow_pickle: Trust the file and unpickle anything in it.
        safe_globals: Extra classes the restricted unpickler may rebuild.

    """
    if not Path(f).is_file():
        raise CheckpointNotFoundError(f"{os.fspath(f)!r} does not exist or is not a file.")
    if is_safetensors_file(f):
        loaded = read_safetensors(f)
        tensors = loaded.tensors
        if map_location is not None:
            tensors = {name: tensor.to(map_location) for name, tensor in tensors.items()}
        return decode_state(tensors, loaded.metadata, os.fspath(f))
    return load_pickled(
        f, allow_pickle=allow_pickle, map_location=map_location, safe_globals=safe_globals
    )
