"""Splitting a state dict into shards of at most ``max_shard_size`` and the JSON index naming them.

File names follow the Hugging Face convention: ``model.safetensors`` when one file suffices, else
``model-00001-of-00003.safetensors`` ... plus ``model.safetensors.index.json`` holding
``{"metadata": {"total_size": ...}, "weight_map": {key: file}}`` (``pytorch_model*.bin`` for
pickled weights). The index's metadata also records ``accel_aliases``: tied keys that were
stored once, as ``{alias: stored_key}``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from accel_ckpt.atomic import atomic_file
from accel_ckpt.errors import CorruptCheckpointError

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"

#: Every file name :func:`accel_ckpt.save_model` may write (used to remove stale shards).
WEIGHT_FILE_PATTERN = re.compile(
    r"^(model(-\d{5}-of-\d{5})?\.safetensors|pytorch_model(-\d{5}-of-\d{5})?\.bin"
    r"|model\.safetensors\.index\.json|pytorch_model\.bin\.index\.json)$"
)


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes the tensor's data occupies in a file."""
    return tensor.numel() * tensor.element_size()


def shard_state_dict(
    state_dict: Mapping[str, torch.Tensor], max_shard_size: int
) -> list[dict[str, torch.Tensor]]:
    """Group tensors, in order, into shards no larger than ``max_shard_size`` bytes.

    A tensor larger than the limit gets a shard of its own.
    """
    shards: list[dict[str, torch.Tensor]] = [{}]
    current = 0
    for name, tensor in state_dict.items():
        size = tensor_nbytes(tensor)
        if shards[-1] and current + size > max_shard_size:
            shards.append({})
            current = 0
        shards[-1][name] = tensor
        current += size
    return shards


def shard_names(weights_name: str, count: int) -> list[str]:
    """``model.safetensors`` for one shard, else ``model-0000i-of-0000n.safetensors``."""
    if count == 1:
        return [weights_name]
    stem, dot, suffix = weights_name.partition(".")
    return [f"{stem}-{i:05d}-of-{count:05d}{dot}{suffix}" for i in range(1, count + 1)]


def write_index(
    path: str | os.PathLike[str],
    weight_map: Mapping[str, str],
    total_size: int,
    aliases: Mapping[str, str],
) -> None:
    """Write the shard index durably."""
    metadata: dict[str, object] = {"total_size": total_size}
    if aliases:
        metadata["accel_aliases"] = dict(aliases)
    document = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
    with atomic_file(path) as temporary:
        Path(temporary).write_text(json.dumps(document, indent=2) + "\n")


def read_index(path: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The weight map and alias map of a shard index.

    Besides the usual ``{"metadata": ..., "weight_map": {...}}`` a bare ``{tensor: file}``
    object is accepted, as Accelerate's ``load_checkpoint_in_model`` does.
    """
    try:
        document = json.loads(Path(path).read_text())
        if "weight_map" not in document and all(
            isinstance(value, str) for value in document.values()
        ):
            document = {"weight_map": document}
        weight_map = {str(k): str(v) for k, v in document["weight_map"].items()}
        aliases = document.get("metadata", {}).get("accel_aliases", {})
        return weight_map, {str(k): str(v) for k, v in aliases.items()}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise CorruptCheckpointError(
            f"{path} is not a shard index (needs a 'weight_map' object): {error}."
        ) from None
