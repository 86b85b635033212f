"""Accelerate's ``save_fsdp_optimizer`` / ``load_fsdp_optimizer`` for one FSDP model's optimizer.

Layout as Accelerate's: with ``SHARDED_STATE_DICT`` a ``torch.distributed.checkpoint`` folder
``optimizer_<i>`` (each rank its shards; loads on any number of processes), with
``FULL_STATE_DICT`` the gathered state in ``optimizer.bin`` (``optimizer_<i>.bin`` after the
first) written by the main process. Both functions are collective.

Example:
    >>> from accel.utils import save_fsdp_optimizer
    >>> save_fsdp_optimizer(plugin, accelerator, optimizer, model, "out")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from accel.constants import OPTIMIZER_NAME
from accel.strategies.fsdp.common import PathLike, resolve_plugin
from accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

_STATE_KEY = "optimizer"


def _raw(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside an ``AcceleratedOptimizer`` (or the optimizer itself)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner  # type: ignore[no-any-return]


def _full_file(optimizer_index: int) -> str:
    suffix = "" if optimizer_index == 0 else f"_{optimizer_index}"
    return f"{OPTIMIZER_NAME}{suffix}.bin"


def save_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    output_dir: PathLike,
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> Path:
    """Write the optimizer state of a prepared FSDP model into ``output_dir`` (collective).

    Args:
        fsdp_plugin: The plugin; its ``state_dict_type`` picks the layout.
        accelerator: The ``Accelerator`` that prepared ``model`` and ``optimizer``.
        optimizer: The prepared optimizer.
        model: The prepared (sharded) model it steps.
        output_dir: Folder to write into (created when missing).
        optimizer_index: Number in the file or folder name, for several optimizers.
        use_dcp: Accepted for compatibility: the sharded layout is always written with
            ``torch.distributed.checkpoint``.

    Returns:
        The folder (sharded) or file (full) written.
    """
    del use_dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    settings = resolve_plugin(fsdp_plugin, accelerator)
    full = settings.state_dict_type != "SHARDED_STATE_DICT"
    options = StateDictOptions(full_state_dict=full)
    state = get_optimizer_state_dict(model, _raw(optimizer), options=options)
    output = Path(output_dir)
    if full:
        target = output / _full_file(optimizer_index)
        if accelerator.is_main_process:
            output.mkdir(parents=True, exist_ok=True)
            torch.save(state, target)
    else:
        target = output / f"{OPTIMIZER_NAME}_{optimizer_index}"
        save({_STATE_KEY: state}, checkpoint_id=target)
    accelerator.wait_for_everyone()
    return target


def load_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    input_dir: PathLike,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Read a state written by :func:`save_fsdp_optimizer` into the prepared optimizer.

    ``input_dir`` is the folder given to ``save_fsdp_optimizer`` or, for the sharded layout,
    the ``optimizer_<i>`` folder itself. Collective. ``adapter_only`` is accepted for
    Accelerate's signature and has no effect (an optimizer holds trainable parameters only).

    Raises:
        FileNotFoundError: Nothing saved under ``input_dir`` for ``optimizer_index``.
    """
    del use_dcp, fsdp_plugin, adapter_only  # an optimizer steps trainable parameters only
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    raw = _raw(optimizer)
    folder = Path(input_dir)
    sharded = (
        folder
        if (folder / ".metadata").is_file()
        else folder / f"{OPTIMIZER_NAME}_{optimizer_index}"
    )
    if (sharded / ".metadata").is_file():
        state = {_STATE_KEY: get_optimizer_state_dict(model, raw)}
        load(state, checkpoint_id=sharded)
        set_optimizer_state_dict(model, raw, state[_STATE_KEY])
    elif (folder / _full_file(optimizer_index)).is_file():
        full_state = torch.load(folder / _full_file(optimizer_index), weights_only=True)
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, raw, full_state, options=options)
    else:
        raise FileNotFoundError(
            f"load_fsdp_optimizer: no {sharded.name}/ folder and no "
            f"{_full_file(optimizer_index)} in {os.fspath(input_dir)!r}; pass the output_dir "
            "given to save_fsdp_optimizer."
        )
    accelerator.wait_for_everyone()


__all__ = ["load_fsdp_optimizer", "save_fsdp_optimizer"]
