"""Elastic loads of DeepSpeed ZeRO checkpoints through DeepSpeed's universal checkpoint format.

A ZeRO checkpoint holds one optimizer partition per data-parallel rank, so DeepSpeed refuses to
load it on another data-parallel world size. accel then converts it once with
``deepspeed.checkpoint.ds_to_universal`` (rank 0 converts, the others wait for its outcome) into
``<checkpoint>/deepspeed/universal``: written in a hidden temporary folder and renamed into place
when complete, so a crash mid-conversion leaves the published checkpoint untouched and the next
load converts again; a complete conversion is reused. The engine then loads it with its
universal-checkpoint path (``checkpoint.load_universal``), switched on for that call only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from accel.errors import UnsupportedFeatureError
from accel_ckpt import IncompleteCheckpointError
from accel_ckpt.atomic import TMP_TAG, fsync_dir, fsync_file, new_token, remove_tree, sibling

#: The converted checkpoint's folder, beside the engine checkpoint in accel's ``deepspeed`` folder.
UNIVERSAL = "universal"
#: The optimizer states DeepSpeed's ZeRO-3 universal load restores (it hard-codes Adam's).
ZERO3_UNIVERSAL_STATES = {"step", "exp_avg", "exp_avg_sq"}


class UniversalConversionError(RuntimeError):
    """DeepSpeed's universal checkpoint conversion failed (on rank 0)."""


def saved_dp_world_size(checkpoint: Path) -> int:
    """The data-parallel world size the engine checkpoint in ``checkpoint`` was saved on.

    Read from DeepSpeed's own metadata (``dp_world_size`` in its model-states file).

    Raises:
        IncompleteCheckpointError: ``checkpoint`` holds no model-states file.
    """
    files = sorted(
        path for path in checkpoint.glob("*model_states.pt") if "_expert_" not in path.name
    )
    if not files:
        raise IncompleteCheckpointError(
            f"{checkpoint} holds no DeepSpeed model-states file (*model_states.pt); the engine "
            "checkpoint is incomplete."
        )
    try:
        state = torch.load(files[0], map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # not in the zipfile format: read it whole
        state = torch.load(files[0], map_location="cpu", weights_only=False)
    return int(state["dp_world_size"])


def load_elastic(engine: Any, folder: Path, tag: str, saved: int) -> None:
    """Load the engine checkpoint ``folder/tag``, saved on ``saved`` data-parallel ranks.

    Collective: every rank calls it.

    Raises:
        UnsupportedFeatureError: ZeRO-3 with an optimizer whose states DeepSpeed's universal
            load cannot restore.
        UniversalConversionError: The conversion failed.
        IncompleteCheckpointError: DeepSpeed loaded nothing.
    """
    _check_zero3_optimizer(engine, saved)
    root = folder / UNIVERSAL
    convert_once(folder / tag, root, tag)
    with universal_loading(engine, True):
        path, _ = engine.load_checkpoint(
            str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    if path is None:
        raise IncompleteCheckpointError(
            f"DeepSpeed could not load the universal checkpoint in {root} (converted from the "
            f"engine checkpoint saved on {saved} processes)."
        )


@contextlib.contextmanager
def universal_loading(engine: Any, enabled: bool) -> Iterator[None]:
    """Have ``engine.load_checkpoint`` read the universal format (or DeepSpeed's own) meanwhile.

    DeepSpeed reads its ``checkpoint.load_universal`` setting at each load, so an existing
    engine switches for one call; the configured value comes back afterwards.
    """
    config = engine._config
    previous = config.load_universal_checkpoint
    config.load_universal_checkpoint = enabled
    try:
        yield
    finally:
        config.load_universal_checkpoint = previous


def convert_once(source: Path, root: Path, tag: str) -> None:
    """Make ``root/tag`` the universal form of ``source`` unless a complete one is there.

    Rank 0 converts; every rank then learns its outcome (collective when distributed).

    Raises:
        UniversalConversionError: The conversion failed on rank 0.
    """
    error: str | None = None
    if _rank() == 0 and not root.is_dir():
        try:
            _convert(source, root, tag)
        except Exception as failure:  # noqa: BLE001 - reported to every rank below
            error = f"{type(failure).__name__}: {failure}"
    error = _from_rank_zero(error)
    if error is not None:
        raise UniversalConversionError(
            f"Converting the DeepSpeed checkpoint {source} (saved on another number of "
            f"processes) to DeepSpeed's universal format in {root} failed on rank 0: {error}. "
            "Load it on the number of processes it was saved on, or convert it yourself with "
            "python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state."
        )


def _convert(source: Path, root: Path, tag: str) -> None:
    """Run ``ds_to_universal`` into a hidden folder, fsync it and rename it to ``root``."""
    from deepspeed.checkpoint import ds_to_universal

    for stale in root.parent.glob(f".{root.name}.{TMP_TAG}-*"):  # earlier crashed conversions
        remove_tree(stale)
    temporary = sibling(root, TMP_TAG, new_token())
    temporary.mkdir()
    args = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(temporary / tag),
        num_extract_workers=1,  # in this process: no worker pool forked from a training job
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # accel's models carry no universal-checkpoint info
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ds_to_universal.main(args)
        for path in temporary.rglob("*"):
            if path.is_file():
                fsync_file(path)
        for path in sorted((p for p in temporary.rglob("*") if p.is_dir()), reverse=True):
            fsync_dir(path)
        temporary.rename(root)
        fsync_dir(root.parent)
    except BaseException:
        remove_tree(temporary)
        raise


def _check_zero3_optimizer(engine: Any, saved: int) -> None:
    """Refuse early what DeepSpeed's ZeRO-3 universal load cannot restore.

    Raises:
        UnsupportedFeatureError: ZeRO-3 with an optimizer keeping other states than Adam's.
    """
    if not engine.zero_optimization_partition_weights():
        return
    base = getattr(engine.optimizer, "optimizer", None)
    if base is None:
        return
    amsgrad = any(group.get("amsgrad") for group in base.param_groups)
    if "adam" not in type(base).__name__.lower() or amsgrad:
        raise UnsupportedFeatureError(
            f"Loading a ZeRO-3 checkpoint saved on {saved} processes on "
            f"{engine.seq_dp_world_size}: DeepSpeed's universal checkpoint load under ZeRO-3 "
            f"restores only Adam's optimizer states {sorted(ZERO3_UNIVERSAL_STATES)}, not those "
            f"of {type(base).__name__}{' (amsgrad=True)' if amsgrad else ''}. Use Adam/AdamW "
            f"without amsgrad, or ZeRO-1/2, or load on {saved} processes."
        )


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _from_rank_zero(value: str | None) -> str | None:
    """Rank 0's ``value`` on every rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    shared: list[str | None] = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
