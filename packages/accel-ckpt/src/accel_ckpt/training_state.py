"""Saving and loading a whole training state, on every process, all or nothing.

Folder layout (``output_dir``; ``_1``, ``_2``... for the second, third... object of a kind)::

    model.safetensors            weights of model 0 (pytorch_model.bin if safe_serialization=False)
    optimizer.safetensors        optimizer 0: tensors + JSON structure (accel-tree/1)
    scheduler.safetensors        scheduler 0
    dataloader.safetensors       dataloader 0, when every process has the same state ...
    dataloader_rank<r>.safetensors   ... else one per process
    scaler.safetensors           gradient scaler
    custom_checkpoint_<i>.safetensors  registered object i (.pkl only with allow_pickle=True)
    random_states_<r>.safetensors  RNG states of process r
    accel_manifest.json          written last: every file's size and CRC-32

Protocol: rank 0 (with ``save_on_each_node``, each machine's local rank 0) creates the hidden
sibling ``.<name>.accel-tmp-<token>``; each process writes and fsyncs the files it owns there;
once every process has reported its files, the creator writes the manifest and renames the folder
into place (swapping out and deleting an existing one). Every step exchanges a status, so an error
on any process makes all of them raise, and nothing is committed.

Processes that pass different folders (a folder per rank, say) each commit their own: the lowest
rank naming a folder creates it and writes the shared states (models, optimizers...) there, and
every process writes its own RNG and dataloader states into its folder, so each folder loads on
its own.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import nn

from accel_ckpt._coordination import Coordinator
from accel_ckpt.accelerate_import import (
    is_accelerate_checkpoint,
    load_accelerate_state,
    refuse_pickles,
)
from accel_ckpt.async_save import ARENA, AsyncSave, wait_for_pending_saves
from accel_ckpt.containment import resolve_inside
from accel_ckpt.errors import CheckpointContentsError, InvalidArgumentError
from accel_ckpt.manifest import Manifest, read_manifest, verify_sizes
from accel_ckpt.model_io import unwrap_model
from accel_ckpt.project import ProjectConfiguration, checkpoint_number
from accel_ckpt.rng_state import derive_rng_states, restore_rng_states
from accel_ckpt.sharded_state import ShardedState, check_sharded_states
from accel_ckpt.shared_read import SharedReads
from accel_ckpt.state_reader import CheckpointReader, resolve_input_dir
from accel_ckpt.state_writer import CheckpointWriter, Items, folder_members
from accel_ckpt.stateful import LoadHook, SaveHook, Stateful, Unwrap
from accel_ckpt.xla import materialize_pending
from accel_ops.records import current_record, record, recorded

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


@dataclass
class LoadedCheckpoint:
    """What :func:`load_state` loaded.

    Attributes:
        path: The checkpoint folder.
        manifest: Its manifest (files, contents, ``metadata`` passed to ``save_state``).

    """

    path: Path
    manifest: Manifest

    @property
    def metadata(self) -> dict[str, Any]:
        """The ``metadata`` given to ``save_state``."""
        return self.manifest.metadata


def _parameters(models: Sequence[nn.Module], optimizers: Sequence[Any]) -> Iterator[torch.Tensor]:
    """The models' and optimizers' parameters (to find out whether XLA tensors are saved)."""
    for model in models:
        yield from model.parameters()
    for optimizer in optimizers:
        for group in getattr(optimizer, "param_groups", ()):
            yield from group.get("params", ())


def _resolve_output_dir(output_dir: PathLike | None, config: ProjectConfiguration | None) -> Path:
    if config is not None and config.automatic_checkpoint_naming:
        final = config.checkpoint_dir()
        if output_dir is not None and Path(output_dir) != final:
            logger.warning(
                "automatic_checkpoint_naming is on: saving to %s, not output_dir=%s.",
                final,
                output_dir,
            )
        return final
    if output_dir is None:
        raise InvalidArgumentError(
            "save_state needs output_dir, or project_config=ProjectConfiguration(project_dir=..., "
            "automatic_checkpoint_naming=True)."
        )
    return Path(output_dir)


@overload
def save_state(
    output_dir: PathLike | None = ...,
    *,
    models: Sequence[nn.Module] = ...,
    optimizers: Sequence[Any] = ...,
    schedulers: Sequence[Any] = ...,
    dataloaders: Sequence[Any] = ...,
    scaler: Any = ...,
    custom_objects: Sequence[Any] = ...,
    sharded_states: Sequence[ShardedState] = ...,
    project_config: ProjectConfiguration | None = ...,
    safe_serialization: bool = ...,
    save_on_each_node: bool | None = ...,
    blocking: Literal[True] = ...,
    save_hooks: Sequence[SaveHook] = ...,
    unwrap: Unwrap | None = ...,
    allow_pickle: bool = ...,
    metadata: Mapping[str, Any] | None = ...,
) -> Path: ...


@overload
def save_state(
    output_dir: PathLike | None = ...,
    *,
    models: Sequence[nn.Module] = ...,
    optimizers: Sequence[Any] = ...,
    schedulers: Sequence[Any] = ...,
    dataloaders: Sequence[Any] = ...,
    scaler: Any = ...,
    custom_objects: Sequence[Any] = ...,
    sharded_states: Sequence[ShardedState] = ...,
    project_config: ProjectConfiguration | None = ...,
    safe_serialization: bool = ...,
    save_on_each_node: bool | None = ...,
    blocking: Literal[False],
    save_hooks: Sequence[SaveHook] = ...,
    unwrap: Unwrap | None = ...,
    allow_pickle: bool = ...,
    metadata: Mapping[str, Any] | None = ...,
) -> AsyncSave: ...


@recorded("save_state", operand=False)
def save_state(
    output_dir: PathLike | None = None,
    *,
    models: Sequence[nn.Module] = (),
    optimizers: Sequence[Any] = (),
    schedulers: Sequence[Any] = (),
    dataloaders: Sequence[Any] = (),
    scaler: Any = None,
    custom_objects: Sequence[Any] = (),
    sharded_states: Sequence[ShardedState] = (),
    project_config: ProjectConfiguration | None = None,
    safe_serialization: bool = True,
    save_on_each_node: bool | None = None,
    blocking: bool = True,
    save_hooks: Sequence[SaveHook] = (),
    unwrap: Unwrap | None = None,
    allow_pickle: bool = False,
    metadata: Mapping[str, Any] | None = None,
) -> Path | AsyncSave:
    """Save models, optimizers, schedulers, dataloaders, scaler, custom objects and RNG states.

    Call it on every process. The checkpoint appears at ``output_dir`` only once every process
    has written its files; a crash at any point leaves the previous checkpoint as it was.

    Args:
        output_dir: Checkpoint folder (ignored with automatic naming: then it is
            ``project_dir/checkpoints/checkpoint_<iteration>``). An existing checkpoint there is
            replaced atomically; an existing non-checkpoint folder is refused. Processes may
            pass different folders (one per rank, say): each folder then gets a complete
            checkpoint that those processes can load on their own.
        models: Models (wrappers are removed); saved by the main process.
        optimizers: Optimizers; saved by the main process.
        schedulers: LR schedulers; saved by the main process.
        dataloaders: Objects with ``state_dict()`` (others are skipped); saved once when every
            process agrees, else one file per process.
        scaler: A ``GradScaler``-like object.
        custom_objects: Objects with ``state_dict()``/``load_state_dict()``.
        sharded_states: :class:`ShardedState` objects (a sharded model's weights and optimizer,
            say) that every process writes its part of, each into its own subfolder; written
            before this call returns even with ``blocking=False``. Their models and optimizers
            must not be passed again in ``models``/``optimizers``. With ``blocking=False``
            those that can stage themselves (:class:`StageableShardedState`, FSDP's) are copied
            into host memory before this call returns and written in the background; the others
            are written before it returns.
        project_config: Naming, ``total_limit`` and ``iteration`` (incremented after each save).
        safe_serialization: Model weights as safetensors (else ``pytorch_model.bin``).
        save_on_each_node: Each machine's local main writes its own copy (default from
            ``project_config``, else ``False``).
        blocking: ``False`` snapshots tensors to host memory, returns an :class:`AsyncSave` and
            writes in the background.
        save_hooks: ``hook(models, weights, folder)`` called on every process before writing.
        unwrap: Custom model unwrapping function.
        allow_pickle: Store states that need pickle as ``.pkl`` files instead of raising.
        metadata: JSON data stored in the manifest and returned by :func:`load_state`.

    Returns:
        The checkpoint folder, or an :class:`AsyncSave` when ``blocking=False``.

    Raises:
        CheckpointExistsError: Automatic naming would overwrite, or ``output_dir`` is not a
            checkpoint.
        UnsupportedValueError: A state needs pickle and ``allow_pickle`` is off.
        DistributedCheckpointError: Another process failed.

    """
    wait_for_pending_saves()
    materialize_pending(_parameters(models, optimizers))
    final = _resolve_output_dir(output_dir, project_config)
    user_metadata = dict(metadata or {})
    try:
        json.dumps(user_metadata, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"metadata must be JSON data: {error}.") from None
    per_node = (
        save_on_each_node
        if save_on_each_node is not None
        else bool(project_config and project_config.save_on_each_node)
    )
    items = Items(
        list(models),
        list(optimizers),
        list(schedulers),
        list(dataloaders),
        scaler,
        list(custom_objects),
        check_sharded_states(sharded_states),
    )
    coordinator = Coordinator.current()
    targets = coordinator.step(
        f"Agreeing on the folder of {final}",
        lambda: (os.path.abspath(final), coordinator.node_rank),
    )
    members = folder_members(targets, coordinator.rank, per_node)
    if items.sharded_states and (per_node or len({path for path, _ in targets}) > 1):
        raise InvalidArgumentError(
            "sharded_states need every process to save into one shared folder: pass the same "
            "output_dir on every process and save_on_each_node=False."
        )
    if coordinator.rank == 0 and len({path for path, _ in targets}) > 1:
        logger.info(
            "Processes save to %d different folders; each folder gets a complete checkpoint for "
            "the processes that name it.",
            len({path for path, _ in targets}),
        )
    saver = CheckpointWriter(
        final,
        items,
        coordinator,
        per_node=per_node,
        safe_serialization=safe_serialization,
        allow_pickle=allow_pickle,
        hooks=save_hooks,
        unwrap=unwrap,
        metadata=user_metadata,
        config=project_config,
        members=members,
    )
    prepared = coordinator.step(f"Preparing checkpoint {final}", saver.prepare)
    token = prepared[0][0]
    assert token is not None
    reports = None
    try:
        coordinator.step(f"Creating {final}", lambda: saver.create_staging(token))
        saver.planned = coordinator.step(
            f"Collecting state for {final}", lambda: saver.plan_rest([p[1] for p in prepared])
        )
        if items.sharded_states and blocking:  # one exchange for the shards and the files
            reports = coordinator.step(f"Writing checkpoint {final}", saver.write_with_sharded)
        elif items.sharded_states:  # staged here, written on the background thread
            coordinator.step(f"Staging sharded state of {final}", saver.stage_sharded)
        if not blocking:
            coordinator.step(f"Copying state of {final}", lambda: ARENA.snapshot(saver.jobs))
    except BaseException:
        saver.abort()
        raise
    if blocking:
        saver.finish(reports)
        if project_config is not None:
            project_config.iteration += 1
        return final
    if project_config is not None:  # the next save needs the next number before this one ends
        project_config.iteration += 1
    origin = current_record()
    site = origin.site_key if origin is not None else None

    def finish_in_background() -> Path:
        with record("save_state (background)", site=site):
            return saver.finish()

    return AsyncSave(final, finish_in_background)


@recorded("load_state", operand=False)
def load_state(
    input_dir: PathLike | None = None,
    *,
    models: Sequence[nn.Module] = (),
    optimizers: Sequence[Any] = (),
    schedulers: Sequence[Any] = (),
    dataloaders: Sequence[Any] = (),
    scaler: Any = None,
    custom_objects: Sequence[Any] = (),
    sharded_states: Sequence[ShardedState] = (),
    project_config: ProjectConfiguration | None = None,
    strict: bool = True,
    map_location: Any = None,
    load_hooks: Sequence[LoadHook] = (),
    unwrap: Unwrap | None = None,
    allow_pickle: bool = False,
    safe_globals: Sequence[Any] = (),
    load_rng_states: bool = True,
) -> LoadedCheckpoint:
    """Restore what :func:`save_state` saved, into the given objects (call on every process).

    The folder must be complete: its manifest present and every file the right size; files this
    process reads are also checked against their CRC-32 while being read.

    A folder written by Hugging Face Accelerate's ``save_state`` (no manifest; ``optimizer.bin``,
    ``random_states_0.pkl``...) is imported instead, so training can switch libraries: models,
    optimizers, schedulers, scaler, custom objects, RNG states and ``metadata["step"]``. Its
    files are pickles, so this needs ``allow_pickle=True``; Accelerate's sampler files are not
    imported (a warning says so).

    Args:
        input_dir: Checkpoint folder; ``None`` picks the newest complete
            ``checkpoint_<i>`` of ``project_config`` (and sets its ``iteration`` to ``i + 1``).
        models: Models to fill in place (wrappers are removed).
        optimizers: Optimizers.
        schedulers: Schedulers.
        dataloaders: Dataloaders (those without ``load_state_dict`` are skipped).
        scaler: Gradient scaler.
        custom_objects: Objects with ``load_state_dict()``.
        sharded_states: The :class:`ShardedState` objects given to ``save_state``, matched by
            name; each reads its subfolder (on every process).
        project_config: For automatic naming.
        strict: Model keys must match exactly.
        map_location: Device for tensors of custom objects (default: CPU).
        load_hooks: ``hook(models, folder)`` called first; may pop models to load them itself.
        unwrap: Custom model unwrapping function.
        allow_pickle: Allow ``.pkl``/``.bin`` files that need arbitrary code (trusted files only),
            and import Accelerate checkpoints, which are made of them.
        safe_globals: Extra classes the restricted unpickler may rebuild.
        load_rng_states: Restore this process's RNG states.

    Returns:
        The folder and manifest (``.metadata`` is what ``save_state`` got).

    Raises:
        CheckpointNotFoundError: No such checkpoint.
        IncompleteCheckpointError: No manifest, or a listed file is missing.
        CorruptCheckpointError: A file's size, checksum or structure is wrong.
        UnsafeCheckpointError: A pickled file needs code outside the allow-list, or the folder
            is an Accelerate checkpoint and ``allow_pickle`` is off.
        CheckpointContentsError: More objects passed than the checkpoint holds.

    """
    wait_for_pending_saves()
    folder = resolve_input_dir(input_dir, project_config)
    model_list = list(models)
    sharded = check_sharded_states(sharded_states)
    if is_accelerate_checkpoint(folder):
        if sharded:
            raise CheckpointContentsError(
                f"{folder} is an Accelerate checkpoint; its sharded model files cannot be read "
                "into accel's sharded states. Load it without FSDP/DeepSpeed, or save it again "
                "with accel."
            )
        if not allow_pickle:
            refuse_pickles(folder)
        for hook in load_hooks:
            hook(model_list, str(folder))
        imported = load_accelerate_state(
            folder,
            models=model_list,
            optimizers=optimizers,
            schedulers=schedulers,
            dataloaders=dataloaders,
            scaler=scaler,
            custom_objects=custom_objects,
            strict=strict,
            map_location=map_location,
            unwrap=unwrap,
            allow_pickle=allow_pickle,
            load_rng_states=load_rng_states,
            rank=_rank(),
        )
        _advance_iteration(folder, project_config)
        return LoadedCheckpoint(folder, imported)
    manifest = read_manifest(folder)
    verify_sizes(folder, manifest)
    sharing = _shared_reads(folder)
    loader = CheckpointReader(folder, manifest, map_location, allow_pickle, safe_globals, sharing)
    saved_sharded = manifest.contents.get("sharded_states", {})
    for state in sharded:
        if state.name not in saved_sharded:
            raise CheckpointContentsError(
                f"{folder} holds no sharded state named {state.name!r} (it holds "
                f"{sorted(saved_sharded) or 'none'}); was it saved with the same strategy?"
            )
    for hook in load_hooks:
        hook(model_list, str(folder))
    for state in sharded:
        state.load(resolve_inside(folder, state.name, f"sharded state {state.name!r} of {folder}"))
    if sharing is not None:  # collectives, in the same order on every process
        for index, model in enumerate(model_list):
            loader.load_model(
                unwrap_model(model, unwrap), loader.entry("models", index, "a model"), strict
            )
        for index, optimizer in enumerate(optimizers):
            relpath = loader.entry("optimizers", index, "an optimizer")
            optimizer.load_state_dict(loader.state(relpath, optimizer))
    else:
        _load_models_and_optimizers(loader, model_list, optimizers, strict, unwrap)
    for category, kind, objects in (
        ("schedulers", "a scheduler", schedulers),
        ("custom_objects", "a custom object", custom_objects),
    ):
        for index, obj in enumerate(objects):
            obj.load_state_dict(loader.state(loader.entry(category, index, kind)))
    if scaler is not None:
        relpath = manifest.contents.get("scaler")
        if relpath is None:
            raise CheckpointContentsError(
                f"{folder} holds no scaler state but a scaler was passed."
            )
        scaler.load_state_dict(loader.state(relpath))
    rank = _rank()
    for index, dataloader in enumerate(dataloaders):
        if isinstance(dataloader, Stateful):
            relpath = loader.dataloader_file(index, rank)
            shared = loader.dataloader_shared(index)
            dataloader.load_state_dict(loader.state(relpath, shared=shared))
    if load_rng_states:
        _load_rng(folder, manifest, loader, rank)
    _advance_iteration(folder, project_config)
    return LoadedCheckpoint(folder, manifest)


def _load_rng(folder: Path, manifest: Manifest, loader: CheckpointReader, rank: int) -> None:
    """Restore this process's RNG states; with another process count, as documented below.

    Process ``r`` restores the states process ``r`` saved. A process the checkpoint has none for
    (``r >= N``, more processes than saved it) takes those of process ``r % N`` and reseeds
    them with its rank (:func:`~accel_ckpt.rng_state.derive_rng_states`): deterministic and
    distinct per process. Streams of saved processes ``>= M`` are not used. Either way random
    draws (dropout, augmentation) then differ from an uninterrupted ``N``-process run, so a
    warning says so.
    """
    saved = manifest.contents.get("random_states", {})
    relpath = saved.get(str(rank))
    if relpath is not None:
        restore_rng_states(loader.state(relpath, shared=False), os.fspath(folder / relpath))
        return
    count = manifest.num_processes
    source = saved.get(str(rank % count)) if count > 0 else None
    if source is None:
        logger.warning("%s has no RNG state for process %d; RNG not restored.", folder, rank)
        return
    derive_rng_states(loader.state(source, shared=False), rank, os.fspath(folder / source))
    logger.warning(
        "%s was saved by %d processes: process %d has no RNG state of its own, so it continues "
        "from process %d's, reseeded with its rank (deterministic, distinct per process). Random "
        "draws (dropout...) differ from an uninterrupted %d-process run.",
        folder,
        count,
        rank,
        rank % count,
        count,
    )


def _load_models_and_optimizers(
    loader: CheckpointReader,
    models: Sequence[nn.Module],
    optimizers: Sequence[Any],
    strict: bool,
    unwrap: Unwrap | None,
) -> None:
    """Each process reads the files itself, the optimizers in the background."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="accel-load") as pool:
        # Optimizer files (the largest) are read in the background while the models load.
        pending = [
            loader.prefetch(pool, loader.entry("optimizers", index, "an optimizer"), optimizer)
            for index, optimizer in enumerate(optimizers)
        ]
        for index, model in enumerate(models):
            loader.load_model(
                unwrap_model(model, unwrap), loader.entry("models", index, "a model"), strict
            )
        for optimizer, future in zip(optimizers, pending, strict=True):
            optimizer.load_state_dict(future.result())


def _shared_reads(folder: Path) -> SharedReads | None:
    """Sharing for a job whose processes all load ``folder``; ``None`` otherwise.

    Processes that load different folders (one per rank, say) each read their own files.
    """
    if not SharedReads.job_has_peers():
        return None  # one process: nothing to share, and no PartialState is created for it
    coordinator = Coordinator.current()
    sharing = SharedReads.current(coordinator=coordinator)
    if sharing is None:
        return None
    folders = coordinator.all_gather(os.path.abspath(folder))
    return sharing if len(set(folders)) == 1 else None


def _rank() -> int:
    from accel_state.partial_state import PartialState

    return PartialState().process_index


def _advance_iteration(folder: Path, project_config: ProjectConfiguration | None) -> None:
    """With automatic naming, the next save after loading ``checkpoint_<i>`` is ``<i + 1>``."""
    if project_config is not None and project_config.automatic_checkpoint_naming:
        number = checkpoint_number(folder)
        if number is not None and folder.parent == project_config.checkpoints_dir:
            project_config.iteration = number + 1
