"""The per-process side of ``save_state``: plan the files, write them, agree, commit.

Steps, each ending with an exchange of statuses between all processes (see
:class:`accel_ckpt._coordination.Coordinator`): prepare (encode owned states, RNG, dataloader
digests; rank 0 picks a token), create the temporary folder, collect model weights and run hooks,
write and fsync every file, and commit (manifest, rename, ``total_limit``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_ckpt._coordination import Coordinator
from accel_ckpt.atomic import (
    TMP_TAG,
    fsync_dir,
    fsync_file,
    new_token,
    publish_dir,
    recover,
    remove_tree,
    sibling,
)
from accel_ckpt.checksum import FileRecord, crc32_of_file
from accel_ckpt.containment import check_relative_name, check_tree_inside
from accel_ckpt.disk_space import check_free_space, explain_disk_full
from accel_ckpt.errors import (
    CheckpointExistsError,
    InvalidArgumentError,
    UnsupportedValueError,
)
from accel_ckpt.file_jobs import FileJob
from accel_ckpt.manifest import MANIFEST_NAME, Manifest, is_complete, write_manifest
from accel_ckpt.memory import tensor_bytes
from accel_ckpt.model_io import split_aliases, unwrap_model, weights_metadata
from accel_ckpt.object_io import encode_state
from accel_ckpt.project import ProjectConfiguration, apply_total_limit
from accel_ckpt.rng_state import capture_rng_states
from accel_ckpt.safetensors_io import cpu_contiguous
from accel_ckpt.sharded_state import ShardedState, StageableShardedState, StagedWrite
from accel_ckpt.stateful import SaveHook, Stateful, Unwrap, numbered
from accel_ckpt.xla import host_copies


@dataclass
class Items:
    """The objects one ``save_state`` call was given."""

    models: list[nn.Module]
    optimizers: list[Any]
    schedulers: list[Any]
    dataloaders: list[Any]
    scaler: Any
    custom_objects: list[Any]
    sharded_states: list[ShardedState] = field(default_factory=list)


@dataclass(frozen=True)
class FileReport:
    """One written file, as a process reports it to the committing process."""

    category: str
    index: int
    rank: int
    node_rank: int
    per_rank: bool
    relpath: str
    record: FileRecord


def folder_members(targets: Sequence[tuple[str, int]], rank: int, per_node: bool) -> list[int]:
    """The ranks that commit one folder together with ``rank``, lowest (the creator) first.

    ``targets`` holds every rank's absolute folder and machine index. Ranks that name the same
    folder share it (and, with ``per_node``, only those on the same machine); ranks that pass
    their own folders each get a complete checkpoint of their own.
    """

    def key(entry: tuple[str, int]) -> tuple[str, int]:
        return entry[0], entry[1] if per_node else 0

    mine = key(targets[rank])
    return [other for other, entry in enumerate(targets) if key(entry) == mine]


def state_job(
    obj: Any, relbase: str, category: str, index: int, what: str, allow_pickle: bool
) -> FileJob:
    """The file storing ``obj.state_dict()``: ``relbase.safetensors``, or ``.pkl`` if it must."""
    if not isinstance(obj, Stateful):
        raise InvalidArgumentError(
            f"{what} ({type(obj).__name__}) needs state_dict() and load_state_dict() methods "
            "to be checkpointed."
        )
    state = obj.state_dict()
    try:
        tensors, metadata = encode_state(state, what)
    except UnsupportedValueError:
        if not allow_pickle:
            raise
        return FileJob(f"{relbase}.pkl", category, index, pickled=state)
    return FileJob(f"{relbase}.safetensors", category, index, tensors, metadata)


def digest(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> str:
    """A hash of an encoded state, to tell whether processes hold the same one."""
    hasher = hashlib.sha256(json.dumps(dict(metadata), sort_keys=True).encode())
    for name in sorted(tensors):
        data = cpu_contiguous(tensors[name])
        hasher.update(name.encode())
        hasher.update(str((data.dtype, tuple(data.shape))).encode())
        hasher.update(tensor_bytes(data))
    return hasher.hexdigest()


class CheckpointWriter:
    """The per-process state of one ``save_state`` call.

    Args:
        final: The checkpoint folder to commit.
        items: The objects to save.
        coordinator: This process's place in the job.
        per_node: Each machine's local rank 0 commits a copy (``save_on_each_node``).
        safe_serialization: Weights as safetensors, else ``pytorch_model.bin``.
        allow_pickle: Store states that need pickle as ``.pkl``.
        hooks: Pre-save hooks.
        unwrap: Custom model unwrapping.
        metadata: JSON data for the manifest.
        config: Project configuration (automatic naming, ``total_limit``).
        members: The ranks that write this folder, creator first (see :func:`folder_members`);
            default: every rank (each machine's with ``per_node``, creator its local rank 0).

    """

    def __init__(
        self,
        final: Path,
        items: Items,
        coordinator: Coordinator,
        *,
        per_node: bool,
        safe_serialization: bool,
        allow_pickle: bool,
        hooks: Sequence[SaveHook],
        unwrap: Unwrap | None,
        metadata: dict[str, Any],
        config: ProjectConfiguration | None,
        members: Sequence[int] | None = None,
    ) -> None:
        self.final = final
        self.items = items
        self.coordinator = coordinator
        self.per_node = per_node
        self.members = None if members is None else frozenset(members)
        if members is not None:
            self.creator = coordinator.rank == min(members)
        else:
            self.creator = coordinator.local_rank == 0 if per_node else coordinator.rank == 0
        self.safe_serialization = safe_serialization
        self.allow_pickle = allow_pickle
        self.hooks = hooks
        self.unwrap = unwrap
        self.metadata = metadata
        self.config = config
        self.automatic = config is not None and config.automatic_checkpoint_naming
        self.jobs: list[FileJob] = []
        self.staging: Path | None = None
        self.loader_states: list[tuple[dict[str, torch.Tensor], dict[str, str]] | None] = []
        self.sharded_reports: list[FileReport] = []
        self.per_rank_loaders: set[int] = set()
        self.planned: list[int] = []  # tensor bytes each rank plans to write (after plan_rest)
        self.staged: list[tuple[int, ShardedState, StagedWrite]] = []  # written by write()

    # ---------------------------------------------------------------- step 1: local preparation
    def prepare(self) -> tuple[str | None, list[str | None]]:
        """Encode this process's states; return rank 0's token and the dataloader digests."""
        if self.creator:
            self._check_target()
        rank = self.coordinator.rank
        tensors, metadata = encode_state(capture_rng_states(), f"RNG states of rank {rank}")
        self.jobs.append(
            FileJob(f"random_states_{rank}.safetensors", "random_states", rank, tensors, metadata)
        )
        digests: list[str | None] = []
        for index, loader in enumerate(self.items.dataloaders):
            if not isinstance(loader, Stateful):
                self.loader_states.append(None)
                digests.append(None)
                continue
            encoded = encode_state(loader.state_dict(), f"dataloader {index}")
            self.loader_states.append(encoded)
            digests.append(digest(*encoded))
        if self.creator:
            self._plan_owned_objects()
        return (new_token() if rank == 0 else None), digests

    def _check_target(self) -> None:
        recover(self.final, is_complete)
        if not self.final.exists():
            return
        if self.automatic:
            raise CheckpointExistsError(
                f"Checkpoint folder {self.final} already exists (iteration "
                f"{self.config.iteration if self.config else '?'}); set "
                "ProjectConfiguration.iteration to the next free number, or load_state() first."
            )
        if not self.final.is_dir():
            raise InvalidArgumentError(f"output_dir={str(self.final)!r} is a file; pass a folder.")
        if any(self.final.iterdir()) and not (self.final / MANIFEST_NAME).exists():
            raise CheckpointExistsError(
                f"output_dir={str(self.final)!r} exists, is not empty and is not an accel "
                "checkpoint (no accel_manifest.json); refusing to replace it. Pass a new folder "
                "or delete it."
            )

    def _plan_owned_objects(self) -> None:
        for base, category, objects in (
            ("optimizer", "optimizers", self.items.optimizers),
            ("scheduler", "schedulers", self.items.schedulers),
        ):
            for index, obj in enumerate(objects):
                relbase = numbered(base, index)
                what = f"{base} {index} ({relbase})"
                self.jobs.append(state_job(obj, relbase, category, index, what, self.allow_pickle))
        for index, obj in enumerate(self.items.custom_objects):
            relbase, what = f"custom_checkpoint_{index}", f"custom object {index}"
            self.jobs.append(
                state_job(obj, relbase, "custom_objects", index, what, self.allow_pickle)
            )
        if self.items.scaler is not None:
            job = state_job(self.items.scaler, "scaler", "scaler", 0, "scaler", self.allow_pickle)
            self.jobs.append(job)

    # ---------------------------------------------------------------- step 2: temporary folder
    def create_staging(self, token: str) -> None:
        """Create the hidden temporary folder (creators) and remember its name (everyone)."""
        self.staging = sibling(self.final, TMP_TAG, token)
        if self.creator:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.staging.mkdir()
            for state in self.items.sharded_states:
                (self.staging / state.name).mkdir()

    # ---------------------------------------------------------------- step 3: hooks and models
    def plan_rest(self, digests: list[list[str | None]]) -> int:
        """Plan dataloader files from every process's digests, run hooks, plan model files.

        Returns:
            The tensor bytes this process will write (for the free-space check).
        """
        assert self.staging is not None
        rank = self.coordinator.rank
        for index, encoded in enumerate(self.loader_states):
            if encoded is None:
                continue
            shared = len({per_rank[index] for per_rank in digests}) == 1
            if shared and not self.creator:
                continue
            relbase = numbered("dataloader", index) + ("" if shared else f"_rank{rank}")
            self.jobs.append(
                FileJob(f"{relbase}.safetensors", "dataloaders", index, encoded[0], encoded[1])
            )
            if not shared:
                self.per_rank_loaders.add(index)
        models = list(self.items.models)
        weights: list[dict[str, Any]] = [
            unwrap_model(model, self.unwrap).state_dict() for model in models
        ]
        for hook in self.hooks:
            hook(models, weights, str(self.staging))
        if self.creator:
            self._plan_models(weights)
        return sum(job.nbytes() for job in self.jobs)

    def _plan_models(self, weights: list[dict[str, Any]]) -> None:
        for index, state_dict in enumerate(weights):
            if self.safe_serialization:
                unique, aliases = split_aliases(state_dict)
                relpath = numbered("model", index, ".safetensors")
                job = FileJob(relpath, "models", index, unique, weights_metadata(aliases))
            else:
                relpath = numbered("pytorch_model", index, ".bin")
                job = FileJob(relpath, "models", index, pickled=host_copies(state_dict))
            self.jobs.append(job)

    def bytes_needed(self) -> int:
        """Tensor bytes every process writing this folder planned (0 before ``plan_rest``)."""
        if not self.planned:
            return 0
        ranks = self.members if self.members is not None else range(len(self.planned))
        return sum(self.planned[rank] for rank in ranks if rank < len(self.planned))

    def _own_bytes(self) -> int:
        rank = self.coordinator.rank
        return self.planned[rank] if rank < len(self.planned) else 0

    # ---------------------------------------------------------------- step 3b: sharded states
    def write_sharded(self) -> None:
        """Let every sharded state write its part into its subfolder (all processes).

        The creator made the subfolders with the temporary folder; the files are listed in the
        manifest at commit time (``contents["sharded_states"]``). Files a state reports with
        their size and checksum are reported to the committing process with the others; the
        rest it checksums itself.
        """
        assert self.staging is not None
        rank = self.coordinator.rank
        for index, state in enumerate(self.items.sharded_states):
            with explain_disk_full(self.final, self.staging, self._own_bytes(), rank):
                written = state.save(self.staging / state.name)
            self._report_sharded(index, state, written)

    def stage_sharded(self) -> None:
        """Stage the sharded states that can be written in the background (all processes).

        Those that cannot (no ``stage`` method) are written now, as with ``blocking=True``; the
        staged ones are written by :meth:`write`, on the background thread.
        """
        assert self.staging is not None
        rank = self.coordinator.rank
        for index, state in enumerate(self.items.sharded_states):
            if isinstance(state, StageableShardedState):
                self.staged.append((index, state, state.stage()))
                continue
            with explain_disk_full(self.final, self.staging, self._own_bytes(), rank):
                written = state.save(self.staging / state.name)
            self._report_sharded(index, state, written)

    def _write_staged(self) -> None:
        assert self.staging is not None
        rank, group = self.coordinator.rank, self.coordinator.group
        staged, self.staged = self.staged, []
        for index, state, write in staged:
            with explain_disk_full(self.final, self.staging, self._own_bytes(), rank):
                written = write(self.staging / state.name, group)
            self._report_sharded(index, state, written)
        _test_hold("ACCEL_CKPT_TEST_HOLD_AFTER_SHARDS", rank, self.staging)

    def _report_sharded(self, index: int, state: ShardedState, written: object) -> None:
        rank, node_rank = self.coordinator.rank, self.coordinator.node_rank
        self.sharded_reports.extend(
            FileReport("sharded_states", index, rank, node_rank, True, relpath, record)
            for relpath, record in _reported_files(state.name, written).items()
        )

    def write_with_sharded(self) -> list[FileReport]:
        """Steps 3b and 4 in one (blocking saves): the sharded states, then this process's files."""
        self.write_sharded()
        return self.write()

    # ---------------------------------------------------------------- step 4: write (any thread)
    def write(self) -> list[FileReport]:
        """Write and fsync this process's files; report them.

        The creator first checks that the file system can hold what every process planned.
        """
        assert self.staging is not None
        coordinator = self.coordinator
        if self.staged:
            self._write_staged()
        if self.creator:
            check_free_space(self.final, self.staging, self.bytes_needed())
        written = []
        for job in self.jobs:
            with explain_disk_full(
                self.final,
                self.staging,
                self._own_bytes(),
                coordinator.rank,
                self.staging / job.relpath,
            ):
                record = job.write(self.staging)
            written.append(
                FileReport(
                    job.category,
                    job.index,
                    coordinator.rank,
                    coordinator.node_rank,
                    job.category == "dataloaders" and job.index in self.per_rank_loaders,
                    job.relpath,
                    record,
                )
            )
        return written + self.sharded_reports

    # ---------------------------------------------------------------- step 5: commit (creators)
    def commit(self, reports: list[list[FileReport]]) -> None:
        """Write the manifest and publish the folder (creators; the others return)."""
        if not self.creator:
            return
        assert self.staging is not None
        files: dict[str, FileRecord] = {}
        contents: dict[str, Any] = {
            "models": [],
            "optimizers": [],
            "schedulers": [],
            "dataloaders": [None] * len(self.items.dataloaders),
            "scaler": None,
            "custom_objects": [],
            "random_states": {},
            "extra_files": [],
            "sharded_states": {state.name: [] for state in self.items.sharded_states},
        }
        check_tree_inside(self.staging, f"checkpoint {self.final} (written by a hook or state)")
        unseen: set[str] = set()  # files sharded states reported, not yet found on disk
        for report in sorted((r for per_rank in reports for r in per_rank), key=_order):
            if not self._writes_here(report):
                continue
            files[report.relpath] = report.record
            _record(contents, report)
            if report.category == "sharded_states":
                unseen.add(report.relpath)
        for path in sorted(self.staging.rglob("*")):
            relpath = path.relative_to(self.staging).as_posix()
            if path.is_dir():
                fsync_dir(path)
            elif relpath in unseen:
                _check_reported(relpath, path.stat().st_size, files[relpath])
                unseen.discard(relpath)
            elif relpath not in files and relpath != MANIFEST_NAME:
                fsync_file(path)  # written by a hook or a sharded state
                size, crc = crc32_of_file(os.fspath(path))
                files[relpath] = FileRecord(size, crc)
                owner = relpath.split("/", 1)[0]
                if "/" in relpath and owner in contents["sharded_states"]:
                    contents["sharded_states"][owner].append(relpath)
                else:
                    contents["extra_files"].append(relpath)
        for relpath in sorted(unseen):
            _check_reported(relpath, None, files[relpath])
        fsync_dir(self.staging)
        manifest = Manifest(
            files=files,
            contents=contents,
            num_processes=self.coordinator.world_size,
            metadata=self.metadata,
        )
        with explain_disk_full(self.final, self.staging, 0, self.coordinator.rank):
            write_manifest(self.staging, manifest)
            publish_dir(self.staging, self.final)
        if self.automatic and self.config is not None and self.config.total_limit is not None:
            apply_total_limit(self.final.parent, self.config.total_limit, keep=self.final)

    def _writes_here(self, report: FileReport) -> bool:
        """Whether ``report``'s file was written into this process's folder."""
        if self.members is not None:
            return report.rank in self.members
        return not self.per_node or report.node_rank == self.coordinator.node_rank

    def abort(self) -> None:
        """Remove the temporary folder after a failure (creators only)."""
        if self.creator and self.staging is not None and self.staging.exists():
            remove_tree(self.staging)

    # ---------------------------------------------------------------- steps 4 and 5 together
    def finish(self, reports: list[list[FileReport]] | None = None) -> Path:
        """Write (unless ``reports`` says it was done), agree, commit.

        On any failure remove the temporary folder and raise.
        """
        try:
            if reports is None:
                reports = self.coordinator.step(f"Writing checkpoint {self.final}", self.write)
            self.coordinator.step(
                f"Committing checkpoint {self.final}", lambda: self.commit(reports)
            )
        except BaseException:
            self.abort()
            self.coordinator.settle_after_failure()
            raise
        return self.final


def _order(report: FileReport) -> tuple[str, int, int]:
    return report.category, report.index, report.rank


def _record(contents: dict[str, Any], report: FileReport) -> None:
    category, relpath = report.category, report.relpath
    if category in ("models", "optimizers", "schedulers", "custom_objects"):
        contents[category].append(relpath)  # reports arrive sorted by index
    elif category == "scaler":
        contents["scaler"] = relpath
    elif category == "random_states":
        contents["random_states"][str(report.rank)] = relpath
    elif category == "dataloaders" and report.per_rank:
        entry = contents["dataloaders"][report.index] or {"per_rank": {}}
        entry["per_rank"][str(report.rank)] = relpath
        contents["dataloaders"][report.index] = entry
    elif category == "dataloaders":
        contents["dataloaders"][report.index] = {"shared": relpath}
    elif category == "sharded_states":
        contents["sharded_states"][relpath.split("/", 1)[0]].append(relpath)


def _check_reported(relpath: str, size: int | None, record: FileRecord) -> None:
    """A file a sharded state reported exists with the size it reported.

    Raises:
        InvalidArgumentError: It does not (the state's ``save`` reported a file it did not write).
    """
    if size == record.size:
        return
    found = "does not exist" if size is None else f"has {size} bytes"
    raise InvalidArgumentError(
        f"Sharded state {relpath.split('/', 1)[0]!r} reported {relpath} with {record.size} "
        f"bytes, but the file {found}; its save() must return only the files it wrote "
        "completely (or None)."
    )


def _reported_files(name: str, written: object) -> dict[str, FileRecord]:
    """Validate what sharded state ``name``'s ``save`` returned: relative path -> (size, crc32).

    Returns:
        Path inside the checkpoint (``name/relpath``) -> its record.

    Raises:
        InvalidArgumentError: It returned something else than ``None`` or such a mapping.
    """
    if written is None:
        return {}
    if not isinstance(written, Mapping):
        raise InvalidArgumentError(
            f"Sharded state {name!r}: save() returned {type(written).__name__}; return None or "
            "a mapping of relative file path -> (size, crc32)."
        )
    reported: dict[str, FileRecord] = {}
    for relpath, entry in written.items():
        path = Path(check_relative_name(str(relpath), f"sharded state {name!r}'s save()"))
        try:
            size, crc = (int(value) for value in entry)
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"Sharded state {name!r}: save() reported {relpath!r}: {entry!r}; each value "
                "must be a (size, crc32) pair of integers."
            ) from None
        reported[f"{name}/{path.as_posix()}"] = FileRecord(size, crc)
    return reported


def _test_hold(variable: str, rank: int, staging: Path) -> None:
    """For crash tests only: with ``variable`` naming a folder, stop a background write here.

    The background thread writes ``<folder>/held_rank<rank>`` (listing the temporary folder's
    files) and sleeps for good, so a test can kill the processes deterministically while the
    staged state is half-way to disk. Has no effect on the main thread or when unset.
    """
    folder = os.environ.get(variable)
    if not folder or threading.current_thread() is threading.main_thread():
        return
    files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    marker = Path(folder, f"held_rank{rank}")
    marker.with_suffix(".tmp").write_text(json.dumps(files))
    marker.with_suffix(".tmp").rename(marker)
    while True:
        time.sleep(60)
