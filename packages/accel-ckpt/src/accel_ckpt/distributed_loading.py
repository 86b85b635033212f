"""Loading a full checkpoint into a sharded (DTensor) model, or from rank 0 only.

``load_checkpoint_in_model(full_state_dict=, broadcast_from_rank0=)`` without a ``device_map``
comes here when the model holds DTensors (FSDP2, tensor parallelism) or ``broadcast_from_rank0``
is set: each file goes through torch's ``set_model_state_dict``, which cuts full tensors into the
local shards; with ``broadcast_from_rank0`` only process 0 reads files and torch broadcasts them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from accel_ckpt.errors import InvalidArgumentError, StateDictMismatchError, format_keys
from accel_ckpt.pickle_io import load_pickled
from accel_ckpt.safetensors_io import read_safetensors
from accel_state.torch_compat import is_dtensor


def holds_dtensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is a ``DTensor``."""
    return any(is_dtensor(t) for t in (*model.parameters(), *model.buffers()))


def _read(path: Path, allow_pickle: bool) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return dict(read_safetensors(path).tensors)
    loaded = load_pickled(path, allow_pickle=allow_pickle)
    return dict(loaded)


def load_with_state_dict_options(
    model: nn.Module,
    files: Callable[[], list[Path]],
    *,
    strict: bool,
    allow_pickle: bool,
    full_state_dict: bool,
    broadcast_from_rank0: bool,
) -> tuple[list[str], list[str]]:
    """Load the checkpoint files that ``files()`` lists into ``model``.

    With ``broadcast_from_rank0`` only process 0 lists and reads them.

    Returns:
        ``(missing_keys, unexpected_keys)`` as seen by process 0, on every process.

    Raises:
        InvalidArgumentError: ``broadcast_from_rank0`` without an initialised process group.
        StateDictMismatchError: ``strict`` and keys are missing or unexpected.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    distributed = dist.is_available() and dist.is_initialized()
    if broadcast_from_rank0 and not distributed:
        raise InvalidArgumentError(
            "load_checkpoint_in_model(broadcast_from_rank0=True) needs an initialised process "
            "group (process 0 reads the files and broadcasts them); create the Accelerator or "
            "PartialState first, or pass broadcast_from_rank0=False."
        )
    reads = not broadcast_from_rank0 or dist.get_rank() == 0
    model_keys = set(model.state_dict().keys())
    paths = files() if reads else []
    states = [_read(path, allow_pickle) for path in paths]
    seen = set().union(*(state.keys() for state in states)) if states else set()
    keys: list[Any] = [sorted(model_keys - seen), sorted(seen - model_keys), len(states)]
    if broadcast_from_rank0:
        dist.broadcast_object_list(keys, src=0)
    missing, unexpected, count = keys
    if strict and (missing or unexpected):
        raise StateDictMismatchError(
            f"Cannot load {[str(f) for f in paths] or 'the checkpoint'} strictly: missing "
            f"{format_keys(missing)}, unexpected {format_keys(unexpected)}."
        )
    options = StateDictOptions(
        full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0, strict=False
    )
    for index in range(count):
        state = states[index] if reads else {}
        set_model_state_dict(
            model, {k: v for k, v in state.items() if k in model_keys}, options=options
        )
    return missing, unexpected
