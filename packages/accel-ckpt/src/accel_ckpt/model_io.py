"""Saving a model's weights: sharded safetensors or pickled ``.bin``, tied weights stored once.

:func:`save_model` writes on the main process only. Tied weights (state-dict keys that are the
same tensor) are stored once and recorded as ``accel_aliases`` in the file metadata and the
index, so they come back tied. Each file is replaced atomically; the old index is removed before
new shards take its place and the new index is written last, so an interrupted save leaves the
old model, the new one, or a folder that fails to load with a clear error, never a silent mix.
For all-or-nothing snapshots of whole training runs use :func:`accel_ckpt.save_state`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_ckpt.atomic import TMP_TAG, fsync_dir, new_token, sibling
from accel_ckpt.errors import (
    InvalidArgumentError,
    UnsupportedValueError,
)
from accel_ckpt.memory import require_plain_tensor
from accel_ckpt.pickle_io import save_pickled
from accel_ckpt.safetensors_io import write_safetensors
from accel_ckpt.sharding import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHT_FILE_PATTERN,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    shard_names,
    shard_state_dict,
    tensor_nbytes,
    write_index,
)
from accel_ckpt.sizes import parse_size
from accel_ckpt.xla import is_xla, materialize_pending, tensor_identity

PathLike = str | os.PathLike[str]
_WRAPPER_NAMES = {"DistributedDataParallel", "DataParallel", "DeepSpeedEngine", "PipelineEngine"}
ALIASES_KEY = "accel_aliases"


def unwrap_model(
    model: nn.Module, unwrap: Callable[[nn.Module], nn.Module] | None = None
) -> nn.Module:
    """The user's model inside DDP / DataParallel / DeepSpeed wrappers and ``torch.compile``.

    Args:
        model: Possibly wrapped model.
        unwrap: Custom unwrapping function; when given it is used instead.

    """
    if unwrap is not None:
        return unwrap(model)
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        original = getattr(model, "_orig_mod", None)
        if isinstance(original, nn.Module):
            model = original
            continue
        inner = getattr(model, "module", None)
        if type(model).__name__ in _WRAPPER_NAMES and isinstance(inner, nn.Module):
            model = inner
            continue
        break
    return model


def split_aliases(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store tied tensors once: ``(unique tensors, {alias: stored key})``.

    Keys are aliases when they are the same view of the same memory (tied weights). Partially
    overlapping views are kept as separate tensors (their bytes are written twice).
    """
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise UnsupportedValueError(
                f"state_dict[{name!r}] is a {type(tensor).__name__}, not a tensor; model weights "
                "must be tensors (store other state with save_state(custom_objects=[...]))."
            )
        require_plain_tensor(tensor, f"state_dict[{name!r}]")
        if tensor.numel() == 0:
            unique[name] = tensor
            continue
        key = tensor_identity(tensor)
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = tensor
    return unique, aliases


def weights_metadata(aliases: Mapping[str, str]) -> dict[str, str]:
    """The ``__metadata__`` of a weights file (``format: pt`` as transformers expects)."""
    metadata = {"format": "pt"}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(dict(aliases), sort_keys=True)
    return metadata


def _is_main_process() -> bool:
    from accel_state.partial_state import PartialState

    return PartialState().is_main_process


def _with_offloaded_weights(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor]
) -> Mapping[str, torch.Tensor]:
    """``state_dict`` with the weights of offloaded modules (meta in the model) read back in.

    A model dispatched with CPU or disk offload holds its offloaded weights on the meta device;
    their values are brought in module by module, as Accelerate's ``save_model`` does.
    """
    if not any(
        isinstance(t, torch.Tensor) and t.device.type == "meta" for t in state_dict.values()
    ):
        return state_dict
    from accel_ckpt.big_modeling.hooks import offloading_hook
    from accel_ckpt.big_modeling.model_helpers import get_state_dict_offloaded_model

    if not any(offloading_hook(module) is not None for module in model.modules()):
        return state_dict
    gathered = get_state_dict_offloaded_model(model)
    return {
        name: gathered.get(name, tensor)
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta"
        else tensor
        for name, tensor in state_dict.items()
    }


def save_model(
    model: nn.Module,
    save_directory: PathLike,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
    *,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    unwrap: Callable[[nn.Module], nn.Module] | None = None,
    is_main_process: bool | None = None,
) -> list[Path]:
    """Save a model's weights to ``save_directory`` (on the main process only).

    Writes ``model.safetensors`` or, above ``max_shard_size``, ``model-00001-of-0000n.safetensors``
    shards plus ``model.safetensors.index.json``; ``pytorch_model*.bin`` files when
    ``safe_serialization=False``. Weight files of an earlier save that are not part of this one
    are removed. Call ``wait_for_everyone()`` before it, as in Accelerate.

    Args:
        model: The model; DDP/DataParallel/``torch.compile`` wrappers are removed.
        save_directory: Folder to write into (created if needed).
        max_shard_size: Largest shard: an int (bytes) or ``"200KB"``, ``"1GB"``, ``"10GiB"``...
        safe_serialization: safetensors (default) or pickled ``torch.save`` files.
        state_dict: Save this instead of the model's own state dict.
        unwrap: Custom unwrapping function.
        is_main_process: Whether this process writes (default: ``PartialState().is_main_process``).

    Returns:
        The files written (empty on other processes).

    """
    limit = parse_size(max_shard_size)
    if is_main_process is None:
        is_main_process = _is_main_process()
    if not is_main_process:
        return []
    directory = Path(save_directory)
    if directory.exists() and not directory.is_dir():
        raise InvalidArgumentError(
            f"save_directory={os.fspath(save_directory)!r} is a file; pass a folder path."
        )
    directory.mkdir(parents=True, exist_ok=True)
    if state_dict is None:
        state_dict = unwrap_model(model, unwrap).state_dict()
    state_dict = _with_offloaded_weights(unwrap_model(model, unwrap), state_dict)
    materialize_pending(state_dict.values())
    unique, aliases = split_aliases(state_dict)
    shards = shard_state_dict(unique, limit)
    weights_name = SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME
    names = shard_names(weights_name, len(shards))
    staged: list[tuple[Path, Path]] = []
    try:
        for name, shard in zip(names, shards, strict=True):
            temporary = sibling(directory / name, TMP_TAG, new_token())
            staged.append((temporary, directory / name))
            shard_aliases = {a: c for a, c in aliases.items() if c in shard}
            if safe_serialization:
                write_safetensors(temporary, shard, weights_metadata(shard_aliases))
            else:
                full = dict(shard)
                full.update({alias: shard[canonical] for alias, canonical in shard_aliases.items()})
                save_pickled(_compact(full), temporary)
        # Drop the old index first: from here until the new index lands, a half-replaced set of
        # shards is unindexed and fails to load instead of loading as a mix.
        for index_name in (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME):
            (directory / index_name).unlink(missing_ok=True)
        fsync_dir(directory)
        for temporary, final in staged:
            os.replace(temporary, final)
        fsync_dir(directory)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise
    written = [final for _, final in staged]
    if len(shards) > 1:
        weight_map = {key: name for name, shard in zip(names, shards, strict=True) for key in shard}
        if not safe_serialization:
            weight_map.update(
                {alias: weight_map[canonical] for alias, canonical in aliases.items()}
            )
        index_name = SAFE_WEIGHTS_INDEX_NAME if safe_serialization else WEIGHTS_INDEX_NAME
        total = sum(tensor_nbytes(tensor) for tensor in unique.values())
        write_index(
            directory / index_name, weight_map, total, aliases if safe_serialization else {}
        )
        written.append(directory / index_name)
    keep = {path.name for path in written}
    for stale in directory.iterdir():
        if WEIGHT_FILE_PATTERN.match(stale.name) and stale.name not in keep:
            stale.unlink(missing_ok=True)
    fsync_dir(directory)
    return written


def _compact(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone views of larger storages so ``torch.save`` does not write the whole storage.

    XLA tensors are copied to the host, so the file loads without torch_xla.
    """
    result = {}
    for name, tensor in state_dict.items():
        if is_xla(tensor):
            result[name] = tensor.detach().cpu()
            continue
        whole = tensor.untyped_storage().nbytes() == tensor_nbytes(tensor)
        result[name] = tensor.detach() if whole else tensor.detach().clone()
    return result
