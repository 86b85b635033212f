"""Loading weights in any layout save_model (or Hugging Face tools) writes into a model.

A single ``.safetensors``/``.bin`` file, a ``*.index.json`` with its shards, or a folder holding
either. Key and shape checks run before any weight changes (from safetensors headers and shard
indexes); safetensors bytes are read straight into parameters that already have the right
device, dtype and shape; tied weights stay tied.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from accel_ckpt.checksum import FileRecord
from accel_ckpt.containment import resolve_inside
from accel_ckpt.distributed_loading import holds_dtensors, load_with_state_dict_options
from accel_ckpt.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidArgumentError,
    StateDictMismatchError,
    format_keys,
)
from accel_ckpt.model_io import ALIASES_KEY, unwrap_model
from accel_ckpt.pickle_io import load_pickled
from accel_ckpt.placement import DeviceLike, Placer, resolve_dtype
from accel_ckpt.safetensors_io import (
    SafetensorsHeader,
    iter_safetensors,
    read_header,
    read_safetensors,
)
from accel_ckpt.sharding import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    read_index,
)
from accel_ckpt.shared_read import SharedReads

logger = logging.getLogger(__name__)
# Accelerate reports unused checkpoint weights on ``accelerate.utils.modeling``; accel's twin.
_modeling_logger = logging.getLogger("accel.utils.modeling")

PathLike = str | os.PathLike[str]


class IncompatibleKeys(NamedTuple):
    """Keys that did not line up when loading (empty lists when everything matched)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


@dataclass
class ModelSource:
    """The files of a model checkpoint, in load order."""

    files: list[Path]
    safetensors: bool
    keys: set[str] | None = None
    aliases: dict[str, str] = field(default_factory=dict)


def _from_index(index: Path) -> ModelSource:
    weight_map, aliases = read_index(index)
    names = sorted(set(weight_map.values()))
    files = [resolve_inside(index.parent, name, f"shard index {index}") for name in names]
    for path in files:
        if not path.is_file():
            raise CheckpointNotFoundError(
                f"{path} is listed in {index} but missing; the shards are incomplete. Re-save "
                "the model or copy the missing shard."
            )
    safetensors = all(name.endswith(".safetensors") for name in names)
    return ModelSource(files, safetensors, set(weight_map), aliases)


def resolve_model_checkpoint(checkpoint: PathLike) -> ModelSource:
    """Find the weight files of ``checkpoint``: a file, a shard index, or a folder holding either.

    In a folder the first found of ``model.safetensors.index.json``, ``model.safetensors``,
    ``pytorch_model.bin.index.json`` and ``pytorch_model.bin`` is used.

    Raises:
        CheckpointNotFoundError: Nothing loadable there; the message lists what was looked for.

    """
    path = Path(checkpoint)
    if path.is_file():
        if path.name.endswith(".json"):
            return _from_index(path)
        return ModelSource([path], path.suffix == ".safetensors")
    if not path.is_dir():
        raise CheckpointNotFoundError(
            f"checkpoint={os.fspath(checkpoint)!r} does not exist; pass a weights file, a "
            "*.index.json file or the folder save_model wrote."
        )
    for name in (SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME):
        candidate = path / name
        if candidate.is_file():
            return resolve_model_checkpoint(candidate)
    indexes = sorted(p.name for p in path.glob("*.index.json"))
    if len(indexes) == 1:
        return _from_index(path / indexes[0])
    present = sorted(p.name for p in path.iterdir())[:20]
    raise CheckpointNotFoundError(
        f"{path} holds no model weights: looked for {SAFE_WEIGHTS_INDEX_NAME}, {SAFE_WEIGHTS_NAME}, "
        f"{WEIGHTS_INDEX_NAME}, {WEIGHTS_NAME} or one *.index.json; found {present}. Shards "
        "without an index mean an interrupted save_model: save again."
    )


def _key_problems(
    model_keys: Iterable[str], stored: set[str], ties: Mapping[str, int]
) -> tuple[list[str], list[str]]:
    model_set = set(model_keys)
    covered = {ties[name] for name in stored if name in ties}
    missing = [name for name in model_keys if name not in stored and ties.get(name) not in covered]
    unexpected = sorted(stored - model_set)
    return missing, unexpected


def _raise_for_keys(missing: list[str], unexpected: list[str], source: str) -> None:
    raise StateDictMismatchError(
        f"{source} does not match the model: missing keys {format_keys(missing)}, unexpected keys "
        f"{format_keys(unexpected)}. Load into the model it was saved from, or pass strict=False.",
        missing_keys=missing,
        unexpected_keys=unexpected,
    )


def _check_source(
    model_keys: list[str],
    ties: Mapping[str, int],
    source: ModelSource,
    placer: Placer,
    strict: bool,
) -> tuple[str, dict[Path, SafetensorsHeader], dict[str, str], set[str] | None]:
    """Key and shape checks before any weight changes: ``(label, headers, aliases, stored)``."""
    label = os.fspath(source.files[0].parent if len(source.files) > 1 else source.files[0])
    key_set = set(model_keys)
    headers = {path: read_header(path) for path in source.files} if source.safetensors else {}
    aliases = dict(source.aliases)
    for header in headers.values():
        if ALIASES_KEY in header.metadata:
            try:
                aliases.update(json.loads(header.metadata[ALIASES_KEY]))
            except json.JSONDecodeError:
                raise CorruptCheckpointError(
                    f"{header.path}: its {ALIASES_KEY} metadata is not JSON."
                ) from None
    stored = source.keys
    if headers:
        shapes = {spec.name: spec.shape for h in headers.values() for spec in h.specs}
        stored = set(shapes) | {a for a, c in aliases.items() if c in shapes}
        problems = [
            problem
            for name, shape in shapes.items()
            if name in key_set and (problem := placer.check_shape(name, shape, label)) is not None
        ]
        if problems:
            raise StateDictMismatchError(
                f"Cannot load {label}: {'; '.join(problems[:10])}. Load into a model built with "
                "the same configuration."
            )
    if stored is not None:
        stored |= {a for a, c in aliases.items() if c in stored}
        missing, unexpected = _key_problems(model_keys, stored, ties)
        if strict and (missing or unexpected):
            _raise_for_keys(missing, unexpected, label)
    return label, headers, aliases, stored


def _pickled_tensors(
    path: Path, allow_pickle: bool, record: FileRecord | None, mmap: bool = True
) -> dict[str, torch.Tensor]:
    tensors = load_pickled(path, allow_pickle=allow_pickle, mmap=mmap, expected=record)
    if not isinstance(tensors, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in tensors.values()
    ):
        raise CorruptCheckpointError(f"{path} does not hold a state dict of tensors.")
    return dict(tensors)


def _finish_load(
    model: nn.Module,
    placer: Placer,
    model_keys: list[str],
    ties: Mapping[str, int],
    seen: set[str],
    strict: bool,
    label: str,
) -> IncompatibleKeys:
    placer.finish()
    missing, unexpected = _key_problems(model_keys, seen, ties)
    if strict and (missing or unexpected):
        _raise_for_keys(missing, unexpected, label)
    if unexpected:
        _modeling_logger.warning(
            "Some weights of the model checkpoint at %s were not used when initializing %s: %s. "
            "They are ignored; pass strict=True to make this an error.",
            label,
            type(model).__name__,
            format_keys(unexpected),
        )
    return IncompatibleKeys(missing, unexpected)


def load_model_shared(
    model: nn.Module,
    source: Callable[[], ModelSource],
    placer: Placer,
    sharing: SharedReads,
    *,
    strict: bool,
    allow_pickle: bool = False,
    expected: Mapping[Path, FileRecord] | None = None,
) -> IncompatibleKeys:
    """:func:`load_model_source` with every file read once, by ``sharing``'s source process.

    Collective: every process calls it with the same model layout. The source process resolves
    ``source()``, runs the key and shape checks, then reads one file at a time; its tensors are
    broadcast straight into the other processes' parameters where device, dtype and shape allow.
    An error on the source (no such file, damaged file, mismatched keys) is raised everywhere.
    """
    model_keys = list(model.state_dict(keep_vars=True).keys())
    key_set = set(model_keys)
    ties = placer.tied_groups()
    in_place = {name: placer.current(name) for name in model_keys if placer.reads_in_place(name)}
    checked: list[set[str] | None] = []

    def plan() -> dict[str, Any]:
        found = source()
        label, _, aliases, stored = _check_source(model_keys, ties, found, placer, strict)
        checked.append(stored)
        files = [os.fspath(path) for path in found.files]
        return {
            "label": label,
            "files": files,
            "safetensors": found.safetensors,
            "aliases": aliases,
        }

    layout = sharing.read(plan, "the model checkpoint's layout")
    label, aliases = str(layout["label"]), dict(layout["aliases"])
    seen: set[str] = set()
    for name in layout["files"]:
        path = Path(name)
        record = expected.get(path) if expected is not None else None

        def read(path: Path = path, record: FileRecord | None = record) -> Any:
            if layout["safetensors"]:
                return read_safetensors(path, targets=in_place, expected=record).tensors
            tensors = _pickled_tensors(path, allow_pickle, record, mmap=False)
            if checked[0] is None:
                missing, unexpected = _key_problems(model_keys, set(tensors), ties)
                if strict and (missing or unexpected):
                    _raise_for_keys(missing, unexpected, label)
            return tensors

        tensors = sharing.read(read, os.fspath(path), targets=in_place, allow_pickle=allow_pickle)
        for alias, canonical in aliases.items():
            if canonical in tensors and alias not in tensors:
                tensors[alias] = tensors[canonical]
        for key, value in tensors.items():
            seen.add(key)
            if key in key_set:
                placer.assign(key, value, os.fspath(path))
        del tensors
    return _finish_load(model, placer, model_keys, ties, seen, strict, label)


def load_model_source(
    model: nn.Module,
    source: ModelSource,
    placer: Placer,
    *,
    strict: bool,
    allow_pickle: bool = False,
    expected: Mapping[Path, FileRecord] | None = None,
) -> IncompatibleKeys:
    """Load ``source`` into the (unwrapped) ``model`` through ``placer``.

    Key and shape checks run before any weight is changed, whenever the file format allows
    (safetensors headers and shard indexes always do).
    """
    model_keys = list(model.state_dict(keep_vars=True).keys())
    ties = placer.tied_groups()
    label, headers, aliases, stored = _check_source(model_keys, ties, source, placer, strict)
    key_set = set(model_keys)
    seen: set[str] = set()
    by_canonical: dict[str, list[str]] = {}
    for alias, canonical in aliases.items():
        by_canonical.setdefault(canonical, []).append(alias)
    for path in source.files:
        record = expected.get(path) if expected is not None else None
        if source.safetensors and record is None:
            targets = {
                name: placer.current(name)
                for name in headers[path].names
                if name in key_set and placer.reads_in_place(name)
            }
            mapped = {
                spec.name
                for spec in headers[path].specs
                if spec.name in key_set
                and spec.name not in targets
                and (
                    placer.keeps_on_cpu(spec.name, spec.dtype)
                    or placer.goes_to_accelerator(spec.name)
                )
            }
            for name, value, direct in iter_safetensors(path, targets=targets, mapped=mapped):
                for key in [name, *by_canonical.get(name, [])]:
                    seen.add(key)
                    if key in key_set:
                        placer.assign(key, value, os.fspath(path), owned=not direct and key == name)
                del value
            continue
        if source.safetensors:
            targets = {
                name: placer.current(name)
                for name in headers[path].names
                if name in key_set and placer.reads_in_place(name)
            }
            tensors = read_safetensors(path, targets=targets, expected=record).tensors
        else:
            tensors = _pickled_tensors(path, allow_pickle, record)
            if stored is None:
                missing, unexpected = _key_problems(model_keys, set(tensors), ties)
                if strict and (missing or unexpected):
                    _raise_for_keys(missing, unexpected, label)
        for alias, canonical in aliases.items():
            if canonical in tensors and alias not in tensors:
                tensors[alias] = tensors[canonical]
        for name, value in tensors.items():
            seen.add(name)
            if name in key_set:
                placer.assign(name, value, os.fspath(path))
    return _finish_load(model, placer, model_keys, ties, seen, strict, label)


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: PathLike,
    device_map: Mapping[str, DeviceLike] | None = None,
    offload_folder: PathLike | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
    *,
    allow_pickle: bool = False,
    unwrap: Callable[[nn.Module], nn.Module] | None = None,
) -> IncompatibleKeys:
    """Load a checkpoint (single file, sharded index, or folder; safetensors or bin) into a model.

    Tensors go to the devices in ``device_map`` (``{"": device}`` or per-module prefixes; the
    longest matching prefix wins; ``"disk"`` writes them to ``offload_folder``). Parameters
    already on the right device and dtype are filled in place (safetensors bytes are read straight
    into them), so tied weights and optimizer references survive; others, including meta tensors,
    are replaced, keeping ties.

    Args:
        model: The model to fill (wrappers are removed).
        checkpoint: A ``.safetensors``/``.bin`` file, a ``*.index.json`` file or a folder.
        device_map: Where each module's tensors go; ``None`` keeps them where they are.
        offload_folder: Folder for tensors mapped to ``"disk"``.
        dtype: With a ``device_map``, cast floating-point weights and buffers to this dtype.
            Without one, as in Accelerate, values take the dtypes the model already has
            (``load_state_dict`` semantics) and ``dtype`` is ignored, with a warning.
        offload_state_dict: Accepted for compatibility; shards are always loaded one at a time.
        offload_buffers: Also offload buffers mapped to ``"disk"``.
        keep_in_fp32_modules: Modules kept in float32 when ``dtype`` is float16 (module names,
            matched as whole dotted components).
        offload_8bit_bnb: Refused: quantized loading and offload go through
            :func:`~accel_ckpt.big_modeling.load_and_quantize_model`.
        strict: Raise when keys are missing or unexpected (else unexpected keys are logged).
        full_state_dict: The files hold full tensors, cut into the local shards of a DTensor
            (FSDP2, tensor-parallel) model; ``False`` passes them as they are (torch's
            ``StateDictOptions``). Used without a ``device_map`` on a DTensor model, or with
            ``broadcast_from_rank0``.
        broadcast_from_rank0: Only process 0 reads the checkpoint (the path need not exist on
            the others) and its tensors are broadcast; needs a process group (collective: every
            process calls this). On a model without DTensors and without a ``device_map``, each
            file is read once and sent on as it is read, so no process holds the whole
            checkpoint twice.
        allow_pickle: Allow ``.bin`` files that need arbitrary code to unpickle (trusted files only).
        unwrap: Custom unwrapping function.

    Returns:
        The missing and unexpected keys.

    Raises:
        CheckpointNotFoundError: Nothing loadable at ``checkpoint``.
        StateDictMismatchError: Keys (when ``strict``) or shapes do not match.
        UnsafeCheckpointError: A ``.bin`` file needs code outside the allow-list.

    """
    del offload_state_dict
    if offload_8bit_bnb:
        raise InvalidArgumentError(
            "offload_8bit_bnb=True: load quantized models with "
            "accel_ckpt.big_modeling.load_and_quantize_model(model, BnbQuantizationConfig("
            "load_in_8bit=True), checkpoint, device_map=..., offload_folder=...), which quantizes "
            "each weight as it is read and offloads 8-bit (and 4-bit) layers quantized."
        )
    if resolve_dtype(dtype) is not None and device_map is None:
        logger.warning(
            "load_checkpoint_in_model(dtype=%s) without a device_map keeps the model's dtypes "
            "(as Accelerate does); pass device_map={'': device} to cast the weights.",
            dtype,
        )
        dtype = None
    target = unwrap_model(model, unwrap)
    dtensors = holds_dtensors(target)
    sharing = (
        SharedReads.current()
        if broadcast_from_rank0 and device_map is None and not dtensors
        else None
    )
    if sharing is not None:
        return load_model_shared(
            target,
            lambda: resolve_model_checkpoint(checkpoint),
            Placer(target),
            sharing,
            strict=strict,
            allow_pickle=allow_pickle,
        )
    if device_map is None and (broadcast_from_rank0 or dtensors):
        missing, unexpected = load_with_state_dict_options(
            target,
            lambda: resolve_model_checkpoint(checkpoint).files,
            strict=strict,
            allow_pickle=allow_pickle,
            full_state_dict=full_state_dict,
            broadcast_from_rank0=broadcast_from_rank0,
        )
        return IncompatibleKeys(missing, unexpected)
    source = resolve_model_checkpoint(checkpoint)
    placer = Placer(
        target, device_map, dtype, keep_in_fp32_modules, offload_folder, offload_buffers
    )
    return load_model_source(target, source, placer, strict=strict, allow_pickle=allow_pickle)
