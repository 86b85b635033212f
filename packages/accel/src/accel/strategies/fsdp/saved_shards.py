"""Loading a checkpoint whose models were saved sharded into models that are not sharded now.

A job that saved under FSDP or an N-D mesh stores each model and its optimizers as a
``torch.distributed.checkpoint`` state (``fsdp_model_<i>``), keyed by parameter name. Resumed
under a strategy that keeps whole models (one process with a ``ParallelismConfig`` of ones, or
DDP), the same state loads into the whole models: DCP assembles each full tensor from the saved
shards, whatever the number of processes that wrote them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from accel_ckpt import ShardedState

_FSDP_NAME = re.compile(r"fsdp_model_(\d+)")


def saved_sharded_models(folder: Any) -> int:
    """How many models ``folder``'s checkpoint holds as FSDP sharded states and none as files.

    Returns:
        ``k`` when every model was saved sharded (``fsdp_model_0`` .. ``fsdp_model_<k-1>``), else
        0 (plain models, a mix, an Accelerate folder, or no checkpoint yet: left to the loader).
    """
    from accel_ckpt import is_accelerate_checkpoint, read_manifest

    if not folder.is_dir() or is_accelerate_checkpoint(folder):
        return 0
    contents = read_manifest(folder).contents
    if any(entry is not None for entry in contents.get("models") or []):
        return 0
    numbers = sorted(
        int(match.group(1))
        for name in contents.get("sharded_states", {})
        if (match := _FSDP_NAME.fullmatch(name))
    )
    return len(numbers) if numbers == list(range(len(numbers))) else 0


def adopt_saved_shards(
    folder: Any,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[Any],
    sharded: Sequence[ShardedState],
) -> tuple[list[torch.nn.Module], list[Any], list[ShardedState]]:
    """Read whole models (and their optimizers) from the sharded states they were saved as.

    Applies when this job holds no sharded states and the checkpoint holds exactly one
    ``fsdp_model_<i>`` per model, none as a file; otherwise the split is returned unchanged.

    Args:
        folder: The checkpoint folder being loaded (resolved).
        models: The plain models of this job's checkpoint split.
        optimizers: The plain optimizers of that split.
        sharded: Its sharded states.

    Returns:
        The split to load with: models and the optimizers stepping their parameters move into
        ``fsdp_model_<i>`` states.
    """
    from accel.strategies.fsdp.checkpoint import FSDPModelState, model_optimizers

    if sharded or not models or saved_sharded_models(folder) != len(models):
        return list(models), list(optimizers), list(sharded)
    states: list[ShardedState] = []
    claimed: set[int] = set()
    for index, model in enumerate(models):
        inner = getattr(model, "module", model)  # inside DDP
        mine = model_optimizers(inner, optimizers, claimed)
        states.append(FSDPModelState(name=f"fsdp_model_{index}", model=inner, optimizers=mine))
    return [], [opt for opt in optimizers if id(opt) not in claimed], states
