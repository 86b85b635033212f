"""The DeepSpeed training engine's own checkpoint inside accel's checkpoint folder.

Saved with ``engine.save_checkpoint`` by every rank into the checkpoint's ``deepspeed``
subfolder (tag ``engine``); accel-ckpt lists the files and publishes the folder atomically.

``save_state(blocking=False)``: :meth:`EngineCheckpoint.stage` runs ``engine.save_checkpoint``
in the foreground (its collectives and barriers stay on the training loop's thread) with a
checkpoint engine whose ``save`` only copies each state into host memory; the returned write
puts those copies on disk on the background thread.

Elastic loads: a checkpoint saved on another data-parallel world size is converted once to
DeepSpeed's universal checkpoint format (:mod:`accel.strategies.deepspeed.universal`) and loaded
through the engine's universal-checkpoint path.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

from accel.strategies.deepspeed.universal import (
    load_elastic,
    saved_dp_world_size,
    universal_loading,
)
from accel_ckpt import IncompleteCheckpointError, StagedWrite


class StagingCheckpointEngine:
    """A DeepSpeed checkpoint engine that keeps host copies of what ``save_checkpoint`` saves.

    Set as ``engine.checkpoint_engine`` for one ``save_checkpoint`` call into a scratch folder;
    :attr:`staged` then maps each file's path (relative to that folder) to its state, with every
    tensor cloned to the CPU, so training may go on while the copies are written.
    """

    name = "AccelStagingCheckpointEngine"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staged: dict[str, Any] = {}

    def create(self, info: Any) -> None:
        """Nothing to prepare."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Create ``path`` (in the scratch folder)."""
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        """Keep a host copy of ``state_dict`` to write to ``path`` later."""
        from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

        relative = Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        self.staged[relative] = clone_tensors_for_torch_save(state_dict)

    def load(self, path: str, map_location: Any = None) -> Any:
        """Not used for loading (the engine's own checkpoint engine is back by then).

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"The staging checkpoint engine cannot load {path}.")

    def commit(self, info: Any) -> bool:
        """Nothing to commit: accel-ckpt publishes the folder."""
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        """DeepSpeed's rule: data-parallel rank 0 writes the shared files."""
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        """Saves complete within ``save_checkpoint`` (as far as DeepSpeed knows)."""
        return False

    def preserves_storage_sharing(self) -> bool:
        """``save`` clones every tensor already (views become compact copies)."""
        return False

    def set_commit_info(self, info: Any) -> None:
        """Nothing to record."""

    def get_commit_info(self) -> None:
        """Nothing recorded."""

    def cleanup(self) -> None:
        """Nothing to clean up."""


class EngineCheckpoint:
    """``accel_ckpt.StageableShardedState`` for the training engine's checkpoint."""

    name = "deepspeed"
    tag = "engine"

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def save(self, folder: Path) -> None:
        """Write this rank's part of the engine checkpoint into ``folder`` (collective)."""
        self.engine.save_checkpoint(str(folder), tag=self.tag, save_latest=False)

    def stage(self) -> StagedWrite:
        """Run ``save_checkpoint`` now with every file kept in host memory (collective).

        Returns:
            ``write(folder, process_group)``: writes the copies (and the small files DeepSpeed
            copied, such as ``zero_to_fp32.py``) under ``folder``, fsynced, and reports each with
            its size and CRC-32. It runs no collective.
        """
        scratch = Path(tempfile.mkdtemp(prefix="accel-deepspeed-stage-"))
        try:
            staging = StagingCheckpointEngine(scratch)
            original = self.engine.checkpoint_engine
            self.engine.checkpoint_engine = staging
            try:
                self.engine.save_checkpoint(str(scratch), tag=self.tag, save_latest=False)
            finally:
                self.engine.checkpoint_engine = original
            copied = {
                path.relative_to(scratch).as_posix(): path.read_bytes()
                for path in scratch.rglob("*")
                if path.is_file() and path.relative_to(scratch).as_posix() not in staging.staged
            }
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        states = staging.staged

        def write(folder: Path, group: Any) -> dict[str, tuple[int, int]]:
            import torch

            records: dict[str, tuple[int, int]] = {}
            for relative, state in states.items():
                buffer = io.BytesIO()
                torch.save(state, buffer)
                records[relative] = _write_file(folder / relative, buffer.getbuffer())
            for relative, data in copied.items():
                records[relative] = _write_file(folder / relative, data)
            return records

        return write

    def load(self, folder: Path) -> None:
        """Load the engine checkpoint from ``folder`` (model, optimizer and scheduler states).

        Saved on another data-parallel world size, it goes through DeepSpeed's universal
        checkpoint format (converted once, beside it in ``folder``).

        Raises:
            IncompleteCheckpointError: ``folder`` holds no engine checkpoint.
        """
        checkpoint = folder / self.tag
        if not checkpoint.is_dir():
            raise IncompleteCheckpointError(
                f"{folder} holds no DeepSpeed engine checkpoint (no {self.tag!r} folder); was the "
                "state saved under DeepSpeed?"
            )
        if self.engine.zero_optimization():  # partitioned optimizer states: one per DP rank
            saved = saved_dp_world_size(checkpoint)
            if saved != int(self.engine.seq_dp_world_size):
                load_elastic(self.engine, folder, self.tag, saved)
                return
        # accel saved DeepSpeed's own format here, even where the config asks for universal loads.
        with universal_loading(self.engine, False):
            path, _ = self.engine.load_checkpoint(
                str(folder), tag=self.tag, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        if path is None:
            raise IncompleteCheckpointError(
                f"DeepSpeed could not load the engine checkpoint in {folder}."
            )


def _write_file(path: Path, data: bytes | memoryview) -> tuple[int, int]:
    """Write ``data`` to ``path`` and fsync it; return its size and CRC-32."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return len(data), zlib.crc32(data) & 0xFFFFFFFF
