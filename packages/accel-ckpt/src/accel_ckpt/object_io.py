"""State of any object with ``state_dict()`` as one safetensors file: tensors plus JSON structure.

The file's ``__metadata__`` holds ``accel_format`` (``accel-tree/1``) and ``accel_tree``, the
JSON structure from :mod:`accel_ckpt.tree_codec`; tensors are stored under their path in the
state (``state.0.exp_avg``). Any safetensors reader can open the file; nothing is unpickled.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from accel_ckpt.checksum import FileRecord
from accel_ckpt.errors import CorruptCheckpointError, UnsupportedValueError
from accel_ckpt.safetensors_io import read_safetensors, write_safetensors
from accel_ckpt.tree_codec import decode_tree, encode_tree

TREE_FORMAT = "accel-tree/1"
PathLike = str | os.PathLike[str]


def encode_state(value: Any, what: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and ``__metadata__`` that store ``value``; ``what`` names it in errors."""
    tree, tensors = encode_tree(value, what)
    metadata = {"accel_format": TREE_FORMAT, "accel_tree": json.dumps(tree, allow_nan=True)}
    return tensors, metadata


def save_state_file(path: PathLike, value: Any, what: str, *, durable: bool = True) -> FileRecord:
    """Write ``value`` (usually a ``state_dict()``) to ``path`` as a tree safetensors file."""
    tensors, metadata = encode_state(value, what)
    return write_safetensors(path, tensors, metadata, durable=durable)


def decode_state(tensors: dict[str, torch.Tensor], metadata: dict[str, str], where: str) -> Any:
    """Rebuild the value stored by :func:`encode_state`; a plain safetensors file gives its dict."""
    if metadata.get("accel_format") != TREE_FORMAT:
        return tensors
    try:
        tree = json.loads(metadata["accel_tree"])
    except (KeyError, json.JSONDecodeError) as error:
        raise CorruptCheckpointError(
            f"{where}: the stored structure is unreadable ({error})."
        ) from None
    return decode_tree(tree, tensors, where)


def current_tensors(value: Any) -> dict[str, torch.Tensor]:
    """The tensors of ``value`` under the names :func:`encode_state` gives them (``{}`` if it can't).

    Passed as ``targets`` to :func:`load_state_file`, a stored state is read straight into the
    object's current tensors (e.g. an optimizer's moments) instead of new ones.
    """
    try:
        return encode_tree(value, "current state")[1]
    except UnsupportedValueError:
        return {}


def load_state_file(
    path: PathLike,
    *,
    expected: FileRecord | None = None,
    map_location: Any = None,
    targets: dict[str, torch.Tensor] | None = None,
) -> Any:
    """Read a file written by :func:`save_state_file` (tensors on the CPU unless ``map_location``).

    Tensors in ``targets`` with the same name, dtype and shape are filled in place and returned.
    """
    loaded = read_safetensors(path, expected=expected, targets=targets)
    tensors = loaded.tensors
    if map_location is not None:
        tensors = {name: tensor.to(map_location) for name, tensor in tensors.items()}
    return decode_state(tensors, loaded.metadata, os.fspath(path))
