"""The per-process side of ``load_state``: find the checkpoint, check it, read its files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_ckpt.accelerate_import import latest_accelerate_checkpoint
from accel_ckpt.atomic import committed_path
from accel_ckpt.checksum import FileRecord
from accel_ckpt.errors import (
    CheckpointContentsError,
    CheckpointNotFoundError,
    IncompleteCheckpointError,
    InvalidArgumentError,
)
from accel_ckpt.manifest import MANIFEST_NAME, Manifest, is_complete
from accel_ckpt.model_loading import ModelSource, load_model_shared, load_model_source
from accel_ckpt.object_io import current_tensors, load_state_file
from accel_ckpt.pickle_io import load_pickled
from accel_ckpt.placement import Placer
from accel_ckpt.project import ProjectConfiguration, checkpoint_number, latest_checkpoint
from accel_ckpt.shared_read import SharedReads

PathLike = str | os.PathLike[str]


def resolve_input_dir(input_dir: PathLike | None, config: ProjectConfiguration | None) -> Path:
    """The folder to load: ``input_dir``, or the newest complete checkpoint of ``config``."""
    if input_dir is not None:
        path = Path(input_dir)
        if path.is_dir():
            return path
        found = committed_path(path, is_complete)
        if found is not None:
            return found
        raise CheckpointNotFoundError(
            f"input_dir={os.fspath(input_dir)!r} does not exist; pass the folder save_state wrote."
        )
    if config is None or not config.automatic_checkpoint_naming:
        raise InvalidArgumentError(
            "load_state needs input_dir, or project_config=ProjectConfiguration(project_dir=..., "
            "automatic_checkpoint_naming=True) to pick the newest checkpoint."
        )
    latest = latest_checkpoint(config.checkpoints_dir)
    foreign = latest_accelerate_checkpoint(config.checkpoints_dir)
    if foreign is not None and (latest is None or foreign[0] > (checkpoint_number(latest) or -1)):
        return foreign[1]  # written by Accelerate before the switch; load_state imports it
    if latest is None:
        raise CheckpointNotFoundError(
            f"No complete checkpoint in {config.checkpoints_dir}; save one with save_state first."
        )
    return latest


def _to_location(value: Any, location: str | torch.device, memo: dict[int, Any]) -> Any:
    """``value`` with every tensor moved to ``location`` (a tensor reached twice moves once)."""
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = value.to(location)
        return memo[id(value)]
    if isinstance(value, dict):
        return type(value)((k, _to_location(v, location, memo)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_to_location(v, location, memo) for v in value)
    return value


class CheckpointReader:
    """Reads the files of one committed checkpoint, checking them against its manifest.

    With ``sharing`` (a job of several processes loading the same folder), files every process
    needs identically are read by one process and broadcast (:mod:`accel_ckpt.shared_read`); the
    calls that read them are then collective, in the same order on every process.
    """

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        map_location: Any,
        allow_pickle: bool,
        safe_globals: Sequence[Any],
        sharing: SharedReads | None = None,
    ) -> None:
        self.folder = folder
        self.manifest = manifest
        self.map_location = map_location
        self.allow_pickle = allow_pickle
        self.safe_globals = safe_globals
        # A map_location dict or function is applied by torch.load while reading: read locally.
        movable = map_location is None or isinstance(map_location, (str, torch.device))
        self.sharing = sharing if movable else None

    def entry(self, category: str, index: int, kind: str) -> Any:
        """The manifest's entry for object ``index`` of ``category``."""
        entries = self.manifest.contents.get(category) or []
        if index >= len(entries) or entries[index] is None:
            stored = sum(entry is not None for entry in entries)
            raise CheckpointContentsError(
                f"{self.folder} holds {stored} {category} but load_state got {kind} at position "
                f"{index}; pass the same objects, in the same order, as to save_state."
            )
        return entries[index]

    def record(self, relpath: str) -> FileRecord:
        """Size and checksum of ``relpath``."""
        if relpath not in self.manifest.files:
            raise IncompleteCheckpointError(
                f"{self.folder / relpath} is not listed in {MANIFEST_NAME}."
            )
        return self.manifest.files[relpath]

    def state(self, relpath: str, into: Any = None, shared: bool = True) -> Any:
        """The state stored in ``relpath``; tensors of ``into.state_dict()`` are filled in place.

        ``shared``: the file is the same for every process (not a per-process RNG or dataloader
        file), so with sharing one process reads it for all (collective).
        """
        if self.sharing is None or not shared:
            return self._read(relpath, into)
        use_targets = into is not None and self.map_location is None
        targets = current_tensors(into.state_dict()) if use_targets else None
        path, record = self.folder / relpath, self.record(relpath)

        def read() -> Any:
            if relpath.endswith(".safetensors"):
                return load_state_file(path, expected=record, targets=targets)
            return load_pickled(
                path,
                allow_pickle=self.allow_pickle,
                map_location="cpu",
                safe_globals=self.safe_globals,
                expected=record,
            )

        value = self.sharing.read(
            read,
            os.fspath(path),
            targets=targets,
            allow_pickle=self.allow_pickle,
            safe_globals=self.safe_globals,
        )
        if self.map_location is None:
            return value
        return _to_location(value, self.map_location, {})

    def _read(self, relpath: str, into: Any) -> Any:
        """:meth:`state`, read by this process."""
        path = self.folder / relpath
        if relpath.endswith(".safetensors"):
            use_targets = into is not None and self.map_location is None
            targets = current_tensors(into.state_dict()) if use_targets else None
            return load_state_file(
                path, expected=self.record(relpath), map_location=self.map_location, targets=targets
            )
        return load_pickled(
            path,
            allow_pickle=self.allow_pickle,
            map_location=self.map_location or "cpu",
            safe_globals=self.safe_globals,
            expected=self.record(relpath),
        )

    def prefetch(self, pool: ThreadPoolExecutor, relpath: str, into: Any) -> Future[Any]:
        """:meth:`state` on ``pool``; the targets are taken now, on the calling thread.

        Not with sharing: its collectives must run in the same order on every process.
        """
        if self.sharing is not None:
            raise InvalidArgumentError(
                "CheckpointReader.prefetch with sharing: call state() in order on every process."
            )
        if not relpath.endswith(".safetensors") or self.map_location is not None:
            return pool.submit(self.state, relpath)
        path, record = self.folder / relpath, self.record(relpath)
        targets = current_tensors(into.state_dict())
        return pool.submit(load_state_file, path, expected=record, targets=targets)

    def load_model(self, model: nn.Module, relpath: str, strict: bool) -> None:
        """Fill ``model`` (already unwrapped) in place from ``relpath``."""
        path = self.folder / relpath
        if self.sharing is not None:
            safetensors = relpath.endswith(".safetensors")
            load_model_shared(
                model,
                lambda: ModelSource([path], safetensors),
                Placer(model),
                self.sharing,
                strict=strict,
                allow_pickle=self.allow_pickle,
                expected={path: self.record(relpath)},
            )
            return
        load_model_source(
            model,
            ModelSource([path], relpath.endswith(".safetensors")),
            Placer(model),
            strict=strict,
            allow_pickle=self.allow_pickle,
            expected={path: self.record(relpath)},
        )

    def dataloader_shared(self, index: int) -> bool:
        """Whether dataloader ``index`` has one state for every process."""
        return bool(self.entry("dataloaders", index, "a dataloader").get("shared"))

    def dataloader_file(self, index: int, rank: int) -> str:
        """The file holding dataloader ``index``'s state for process ``rank``."""
        entry = self.entry("dataloaders", index, "a dataloader")
        relpath = entry.get("shared") or entry.get("per_rank", {}).get(str(rank))
        if relpath is None:
            raise CheckpointContentsError(
                f"{self.folder} holds per-process states of dataloader {index} for ranks "
                f"{sorted(entry.get('per_rank', {}), key=int)} but not for rank {rank}; load "
                f"with the {self.manifest.num_processes} processes that saved it."
            )
        return str(relpath)
