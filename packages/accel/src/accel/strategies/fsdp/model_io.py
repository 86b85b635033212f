"""Accelerate's ``accelerate.utils.fsdp_utils`` functions for one FSDP model's weights.

``save_fsdp_model`` writes the prepared model's weights in the layout Accelerate uses outside
``save_state``: with ``SHARDED_STATE_DICT`` a ``torch.distributed.checkpoint`` folder
``pytorch_model_fsdp_<i>`` (each rank its shards; ``merge_fsdp_weights`` turns it into one file),
with ``FULL_STATE_DICT`` the gathered weights in ``pytorch_model_fsdp.bin`` written by the main
process. ``load_fsdp_model`` reads either back into a prepared model, on any number of processes
for the sharded layout. Both are collective: every process calls them.

Example:
    >>> from accel.utils import merge_fsdp_weights, save_fsdp_model
    >>> save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, "out")  # doctest: +SKIP
    >>> merge_fsdp_weights("out/pytorch_model_fsdp_0", "merged")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from accel.ckpt_adapters import merge_fsdp_weights
from accel.constants import FSDP_MODEL_NAME
from accel.errors import UnsupportedFeatureError
from accel.strategies.fsdp.common import (
    PathLike,
    adapter_weights_only,
    get_parameters_from_modules,
    resolve_plugin,
    select_modules,
)
from accel.strategies.fsdp.fsdp2_helpers import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
)
from accel.strategies.fsdp.optimizer import load_fsdp_optimizer, save_fsdp_optimizer
from accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin


def _refuse_per_rank_files(use_dcp: bool) -> None:
    """``use_dcp=False`` asks for Accelerate's per-rank ``.bin`` shards, which accel does not write."""
    if not use_dcp:
        raise UnsupportedFeatureError(
            "use_dcp=False (one torch.save file per rank) is not supported by accel: the sharded "
            "layout is a torch.distributed.checkpoint folder, loadable on any number of "
            "processes; leave use_dcp=True."
        )


def _full_file(model_index: int) -> str:
    return f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"


def save_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: PathLike,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> Path:
    """Write a prepared FSDP model's weights into ``output_dir`` (collective).

    Args:
        fsdp_plugin: The plugin; its ``state_dict_type`` picks the layout.
        accelerator: The ``Accelerator`` that prepared ``model``.
        model: The prepared (sharded) model.
        output_dir: Folder to write into (created when missing).
        model_index: Number in the file or folder name, for several models.
        adapter_only: For a PEFT model, write its adapter (trainable) weights only, as
            Accelerate does; ignored for other models.
        use_dcp: ``True`` only: the sharded layout is a ``torch.distributed.checkpoint`` folder
            (``False``, Accelerate's per-rank files, raises ``UnsupportedFeatureError``).

    Returns:
        The folder (sharded) or file (full) written.

    Raises:
        UnsupportedFeatureError: ``use_dcp=False``.
    """
    from accel.strategies.fsdp.checkpoint import FSDPModelState

    _refuse_per_rank_files(use_dcp)
    adapters = adapter_weights_only(adapter_only, model)
    settings = resolve_plugin(fsdp_plugin, accelerator)
    output = Path(output_dir)
    if settings.state_dict_type == "SHARDED_STATE_DICT":
        target = output / f"{FSDP_MODEL_NAME}_{model_index}"
        FSDPModelState(target.name, model, [], trainable_only=adapters).save(target)
    else:
        target = output / _full_file(model_index)
        if adapters:
            state = _trainable_full_state(accelerator, model)
        else:
            state = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            output.mkdir(parents=True, exist_ok=True)
            torch.save(state, target)
    accelerator.wait_for_everyone()
    return target


def load_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: PathLike,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Read weights written by :func:`save_fsdp_model` into a prepared FSDP model (collective).

    ``input_dir`` is the folder given to ``save_fsdp_model`` or, for the sharded layout, the
    ``pytorch_model_fsdp_<i>`` folder itself. A sharded folder loads on any number of processes.

    With ``adapter_only=True`` and a PEFT model, only its adapter (trainable) weights are read
    (what ``save_fsdp_model(..., adapter_only=True)`` wrote); ignored for other models.

    Raises:
        FileNotFoundError: Nothing saved under ``input_dir`` for ``model_index``.
        UnsupportedFeatureError: ``use_dcp=False``.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from accel.strategies.fsdp.checkpoint import FSDPModelState

    _refuse_per_rank_files(use_dcp)
    adapters = adapter_weights_only(adapter_only, model)
    folder = Path(input_dir)
    sharded = (
        folder if (folder / ".metadata").is_file() else folder / f"{FSDP_MODEL_NAME}_{model_index}"
    )
    if (sharded / ".metadata").is_file():
        FSDPModelState(sharded.name, model, [], trainable_only=adapters).load(sharded)
    elif (folder / _full_file(model_index)).is_file():
        weights = torch.load(folder / _full_file(model_index), weights_only=True)
        options = StateDictOptions(full_state_dict=True, strict=not adapters)
        set_model_state_dict(model, weights, options=options)
    else:
        raise FileNotFoundError(
            f"load_fsdp_model: no {sharded.name}/ folder and no {_full_file(model_index)} in "
            f"{os.fspath(input_dir)!r}; pass the output_dir given to save_fsdp_model."
        )
    accelerator.wait_for_everyone()


def _trainable_full_state(accelerator: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The gathered trainable parameters of a prepared model (complete on the main process)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from accel.strategies.fsdp.checkpoint import off_cpu

    settle = getattr(getattr(accelerator, "strategy", None), "settle", None)
    if settle is not None:
        settle(model)  # read the shards, whatever the last forward left gathered
    options = StateDictOptions(
        full_state_dict=True, cpu_offload=off_cpu(model), ignore_frozen_params=True
    )
    state = get_model_state_dict(model, options=options)
    return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}


__all__ = [
    "FSDP_MODEL_NAME",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "select_modules",
]
