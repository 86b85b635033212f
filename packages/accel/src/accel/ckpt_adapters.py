"""Small ``accelerate.utils`` functions, on top of accel-ckpt: FSDP weight merging and sizes."""

from __future__ import annotations

import os
import shutil

import torch

from accel_ckpt import parse_size
from accel_ckpt.big_modeling.hooks import offloading_hook
from accel_ckpt.merge_weights import merge_weights
from accel_state import PartialState

PathLike = str | os.PathLike[str]


def merge_fsdp_weights(
    checkpoint_dir: PathLike,
    output_path: PathLike,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> None:
    """Merge an FSDP sharded model state into full weights (no process group needed).

    What ``accel merge-weights`` does, under Accelerate's name. In a distributed job every process
    calls it: the main process merges, the others wait until the files are there.

    Args:
        checkpoint_dir: A ``save_state`` checkpoint, one of its ``fsdp_model_<i>`` folders, or a
            ``pytorch_model_fsdp_<i>`` folder written by ``save_fsdp_model``.
        output_path: Folder for ``model.safetensors`` (or shards with an index).
        safe_serialization: safetensors (default) or ``pytorch_model.bin``.
        remove_checkpoint_dir: Delete ``checkpoint_dir`` after a successful merge.
    """
    state = PartialState()
    if state.is_main_process:
        merge_weights(checkpoint_dir, output_path, safe_serialization=safe_serialization)
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    state.wait_for_everyone()


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size`` (an int, or ``"10GB"``, ``"500MiB"``, ``"0MB"``...): Accelerate's name.

    Raises:
        ValueError: ``size`` is negative or not a size.
    """
    return parse_size(size, argument="size", allow_zero=True)


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes per element of ``dtype`` (``torch.bool``: 1/8, as Accelerate counts it)."""
    if dtype == torch.bool:
        return 1 / 8
    return float(torch.empty((), dtype=dtype).element_size())


def has_offloaded_params(module: torch.nn.Module) -> bool:
    """Whether ``module``'s own weights are offloaded (brought in by its hook at each forward).

    The offloading hook counts alone or chained with others in a (nested) SequentialHook.
    """
    return offloading_hook(module) is not None
