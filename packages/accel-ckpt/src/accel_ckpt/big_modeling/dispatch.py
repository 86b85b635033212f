"""Running a model spread over GPUs, the CPU and the disk: dispatch, offload, load-and-dispatch."""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_ckpt.big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
)
from accel_ckpt.big_modeling.memory import (
    CPU,
    DISK,
    DeviceKey,
    check_devices_exist,
    get_max_memory,
    normalize_device_key,
)
from accel_ckpt.big_modeling.offload import (
    INDEX_NAME,
    OffloadedWeightsLoader,
    offload_state_dict,
    offload_weight,
    read_offload_index,
    save_offload_index,
)
from accel_ckpt.big_modeling.planning import (
    check_device_map,
    compute_module_sizes,
    main_device_of,
)
from accel_ckpt.big_modeling.strategies import STRATEGIES as STRATEGIES
from accel_ckpt.big_modeling.strategies import plan_device_map
from accel_ckpt.big_modeling.tensors import named_module_tensors
from accel_ckpt.errors import (
    DeviceMapError,
    DispatchedModelError,
    InsufficientMemoryError,
    StateDictMismatchError,
    format_keys,
)
from accel_ckpt.model_loading import load_checkpoint_in_model
from accel_ckpt.sizes import format_size
from accel_state.torch_compat import accelerator_module

# Accelerate logs from ``accelerate.big_modeling``; accel's twin of that name.
logger = logging.getLogger("accel.big_modeling")

PathLike = str | os.PathLike[str]
_GUARDED_METHODS = ("to", "cuda", "cpu", "xpu")


def _torch_device(key: DeviceKey) -> torch.device:
    if isinstance(key, int):
        accelerator = accelerator_module()
        current = accelerator.current_accelerator() if accelerator is not None else None
        kind = current.type if current is not None and current.type != CPU else "cuda"
        return torch.device(kind, key)
    return torch.device(key)


def _device_of(name: str, device_map: Mapping[str, DeviceKey]) -> DeviceKey | None:
    """The device of tensor ``name`` (longest matching key); ``None`` when no key covers it."""
    best, length = None, -1
    for key, device in device_map.items():
        if (key == "" or name == key or name.startswith(key + ".")) and len(key) > length:
            best, length = device, len(key)
    return best


def _place_tensors(
    model: nn.Module,
    device_map: Mapping[str, DeviceKey],
    offloaded: Callable[[DeviceKey | None], bool],
    main: DeviceKey,
    offload_buffers: bool,
    weights: Mapping[str, torch.Tensor] | None,
) -> None:
    """Move every tensor that stays in memory to its device, once per tensor (ties survive).

    Offloaded tensors stay for the hooks, except buffers (unless ``offload_buffers``) and tensors
    that are device-map entries of their own (no module hook brings them in): those go to
    ``main``, where offloaded modules run.
    """
    holders: dict[int, list[tuple[nn.Module, str, bool, str]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for table, is_param in ((module._parameters, True), (module._buffers, False)):
            for leaf, tensor in table.items():
                if tensor is not None:
                    name = f"{prefix}.{leaf}" if prefix else leaf
                    holders.setdefault(id(tensor), []).append((module, leaf, is_param, name))
    for slots in holders.values():
        module, leaf, is_param, name = slots[0]
        device = _device_of(name, device_map)
        if device is None:
            continue
        current = module._parameters[leaf] if is_param else module._buffers[leaf]
        assert current is not None
        source: torch.Tensor = current
        if offloaded(device):
            if is_param and name not in device_map:
                continue
            if not is_param and offload_buffers and name not in device_map:
                continue
            device = main
            if current.device.type == "meta" and weights is not None and name in weights:
                source = weights[name]
        target = _torch_device(device)
        if source.device.type == "meta" or (source is current and current.device == target):
            continue
        moved: torch.Tensor = source.detach().to(target)
        if is_param:
            moved = nn.Parameter(moved, requires_grad=current.requires_grad)
        for holder, holder_leaf, holder_is_param, _ in slots:
            table = holder._parameters if holder_is_param else holder._buffers
            table[holder_leaf] = moved  # type: ignore[assignment]


def _guard_moves(model: nn.Module) -> None:
    for method_name in _GUARDED_METHODS:
        original = getattr(model, method_name, None)
        if original is None or getattr(original, "_accel_guarded", False):
            continue

        def guarded(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            offloaded = [name for name, p in model.named_parameters() if p.device.type == "meta"]
            if offloaded:
                raise DispatchedModelError(
                    f"Cannot move a dispatched model with {_original.__name__}(): "
                    f"{len(offloaded)} parameter(s) (e.g. {offloaded[0]!r}) are offloaded to the "
                    "CPU or disk and only brought in by its hooks. Call "
                    "remove_hook_from_submodules(model) first, or dispatch it again with "
                    "another device_map."
                )
            logger.warning(
                "Moving a model dispatched with hooks (%s); its hooks still send inputs to the "
                "planned devices.",
                _original.__name__,
            )
            return _original(*args, **kwargs)

        functools.update_wrapper(guarded, original)
        guarded._accel_guarded = True  # type: ignore[attr-defined]
        object.__setattr__(model, method_name, guarded)


def _disk_weights(
    model: nn.Module,
    names: list[str],
    offload_dir: PathLike | None,
    offload_index: Mapping[str, Mapping[str, object]] | None,
) -> dict[str, dict[str, object]]:
    index: dict[str, dict[str, object]] = {
        key: dict(value) for key, value in (offload_index or {}).items()
    }
    if offload_dir is not None and offload_index is None:
        index.update(read_offload_index(offload_dir))
    missing = [name for name in names if name not in index]
    if not missing:
        return index
    tensors = dict(named_module_tensors(model, recurse=True))
    empty = [name for name in missing if tensors[name].device.type == "meta"]
    if empty:
        raise DeviceMapError(
            f"device_map sends {empty[:5]} to 'disk' but they are not in the offload folder "
            f"({offload_dir}) and the model holds no data for them (meta). Load them with "
            "load_checkpoint_and_dispatch(..., offload_folder=...) or pass offload_dir= the "
            "folder they were offloaded to."
        )
    if offload_dir is None:
        raise DeviceMapError(
            "device_map sends modules to 'disk' but offload_dir is None; pass offload_dir='folder'."
        )
    new_index: dict[str, dict[str, object]] = {}
    for name in missing:
        offload_weight(tensors[name], name, offload_dir, new_index)
    save_offload_index(new_index, offload_dir)
    index.update(new_index)
    return index


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, int | str | torch.device],
    main_device: int | str | torch.device | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_dir: PathLike | None = None,
    offload_index: Mapping[str, Mapping[str, object]] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: Iterable[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Run ``model`` spread as ``device_map`` says: hooks move inputs, weights and outputs.

    Modules on a GPU (or on the CPU when no GPU is used) run there; modules mapped to ``"cpu"``
    (when a GPU is the main device) or ``"disk"`` keep their weights off the execution device and
    bring them to the main device one module at a time. Outputs come back on the device of the
    first input. ``model.to()`` afterwards raises :class:`DispatchedModelError` when weights are
    offloaded.

    Args:
        model: The model (weights loaded, or on ``meta`` for disk-offloaded modules).
        device_map: Module name -> GPU index, ``"cpu"`` or ``"disk"``.
        main_device: Where offloaded modules run (default: the first GPU of the map, else CPU).
        state_dict: CPU weights of the CPU-offloaded modules (default: taken from the model).
        offload_dir: Folder with (or for) the disk-offloaded weights.
        offload_index: Its index, when not in ``offload_dir/index.json``.
        offload_buffers: Offload buffers too.
        skip_keys: Input keys not moved between devices.
        preload_module_classes: Classes whose offloaded sub-module weights load all at once.
        force_hooks: Attach hooks even when everything is on one device.

    Returns:
        The model, hooked, with ``hf_device_map`` set.

    Raises:
        DeviceMapError: The map misses a tensor, or names an unknown device or module.

    """
    check_device_map(model, device_map, strict_keys=True)
    normalized = {
        key: normalize_device_key(value, f"device_map[{key!r}]")
        for key, value in device_map.items()
    }
    values = set(normalized.values())
    check_devices_exist(values)
    if len(values) == 1 and DISK not in values and not force_hooks:
        (only,) = values
        model.to(_torch_device(only))
        model.hf_device_map = dict(normalized)  # type: ignore[assignment]
        return model
    main = (
        normalize_device_key(main_device, "main_device")
        if main_device is not None
        else main_device_of(normalized)
    )

    def offloaded(device: DeviceKey | None) -> bool:
        return device == DISK or (device == CPU and main != CPU)

    execution = {
        key: (main if value in (CPU, DISK) else value) for key, value in normalized.items()
    }
    names = [name for name, _ in named_module_tensors(model, recurse=True)]
    kept = {
        name
        for name, _ in named_module_tensors(model, include_buffers=offload_buffers, recurse=True)
    }
    disk_names = [n for n in names if n in kept and _device_of(n, normalized) == DISK]
    cpu_names = [
        n
        for n in names
        if n in kept and offloaded(_device_of(n, normalized)) and n not in disk_names
    ]
    weights: Mapping[str, torch.Tensor] | None = None
    if disk_names or cpu_names:
        tensors = dict(named_module_tensors(model, recurse=True))
        cpu_state = {
            name: (
                state_dict[name]
                if state_dict is not None and name in state_dict
                else tensors[name].detach().to("cpu")
            )
            for name in cpu_names
        }
        index = _disk_weights(model, disk_names, offload_dir, offload_index) if disk_names else {}
        weights = OffloadedWeightsLoader(
            state_dict=cpu_state,
            save_folder=offload_dir,
            index={name: index[name] for name in disk_names},
        )
    _place_tensors(model, normalized, offloaded, main, offload_buffers, weights)
    for key, value in normalized.items():
        module = _module_for(model, key)
        if module is None:
            continue
        if offloaded(value):
            attach_align_device_hook(
                module,
                execution_device=_torch_device(execution[key]),
                offload=True,
                weights_map=weights,
                offload_buffers=offload_buffers,
                module_name=key,
                skip_keys=skip_keys,
                preload_module_classes=preload_module_classes,
            )
        else:
            hook = AlignDevicesHook(
                _torch_device(value), place_submodules=True, skip_keys=skip_keys
            )
            add_hook_to_module(module, hook, append=True)
    add_hook_to_module(
        model, AlignDevicesHook(io_same_device=True, skip_keys=skip_keys), append=True
    )
    if any(offloaded(v) for v in values):
        logger.info(
            "Some parameters are on the meta device: they are offloaded to %s.",
            " and ".join(sorted(str(v) for v in values if offloaded(v))),
        )
    model.hf_device_map = dict(normalized)  # type: ignore[assignment]
    _guard_moves(model)
    return model


def _module_for(model: nn.Module, key: str) -> nn.Module | None:
    """The module named ``key``; ``None`` for a tensor entry (placed by ``_place_tensors``)."""
    try:
        return model.get_submodule(key)
    except AttributeError:
        return None


def _resident_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without the tensors on ``meta`` (they hold no data to keep)."""
    return {
        name: tensor.detach()
        for name, tensor in model.state_dict().items()
        if tensor.device.type != "meta"
    }


def _data_device(model: nn.Module) -> torch.device:
    """Where the model's data is: the first parameter not on ``meta``, else the CPU."""
    for parameter in model.parameters():
        if parameter.device.type != "meta":
            return parameter.device
    return torch.device(CPU)


def _check_offloaded_data(
    model: nn.Module, caller: str, offload_buffers: bool, held: Iterable[str], where: str, fix: str
) -> None:
    """Raise when a tensor on ``meta`` would find no data in the offloaded weights.

    The hooks fill offloaded parameters (and buffers with ``offload_buffers``) from the weights;
    other buffers are moved as they are, which a ``meta`` buffer cannot be.
    """
    available = set(held)
    missing: dict[str, bool] = {}  # name -> is a buffer left in place
    for prefix, module in model.named_modules(remove_duplicate=False):
        for table, offloaded in ((module._parameters, True), (module._buffers, offload_buffers)):
            for leaf, tensor in table.items():
                if tensor is None or tensor.device.type != "meta":
                    continue
                name = f"{prefix}.{leaf}" if prefix else leaf
                if not offloaded or name not in available:
                    missing[name] = not offloaded
    if not missing:
        return
    buffers = (
        " (buffers are only read from there with offload_buffers=True)"
        if any(missing.values())
        else ""
    )
    raise StateDictMismatchError(
        f"{caller}: {len(missing)} tensor(s) of {type(model).__name__} are on the meta device (no "
        f"data) and {where} holds none for them{buffers}: {format_keys(missing)}. Load the "
        f"model's weights first, or {fix}.",
        missing_keys=list(missing),
    )


def _offload_whole_model(
    model: nn.Module,
    caller: str,
    execution_device: int | str | torch.device | None,
    offload_buffers: bool,
    preload_module_classes: Iterable[str] | None,
    *,
    held: Iterable[str],
    where: str,
    fix: str,
    weights: Callable[[], Mapping[str, torch.Tensor]],
) -> nn.Module:
    """Hook every module of ``model`` to bring its weights in from ``weights()`` to run.

    The one set-up of :func:`cpu_offload` and :func:`disk_offload`: tensors on ``meta`` must be
    among ``held`` (checked before ``weights()`` writes anything), and the default execution
    device is where the model's data is, never ``meta``.
    """
    _check_offloaded_data(model, caller, offload_buffers, held, where, fix)
    device = execution_device if execution_device is not None else _data_device(model)
    weights_map = weights()
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model,
        execution_device=device,
        offload=True,
        offload_buffers=offload_buffers,
        weights_map=weights_map,
        preload_module_classes=preload_module_classes,
    )
    _guard_moves(model)
    return model


def cpu_offload(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    preload_module_classes: Iterable[str] | None = None,
) -> nn.Module:
    """Keep the weights in CPU memory and bring each module's to ``execution_device`` to run.

    Args:
        model: The model; tensors on ``meta`` (no data) must be in ``state_dict``.
        execution_device: Where the forward runs (default: the device of the first parameter
            not on ``meta``, else the CPU).
        offload_buffers: Offload buffers too.
        state_dict: The CPU weights (default: the model's state dict, moved to the CPU).
        preload_module_classes: Classes whose sub-module weights load all at once.

    Returns:
        The hooked model; outputs come back on the device of the inputs.

    Raises:
        StateDictMismatchError: A tensor is on ``meta`` and ``state_dict`` has no data for it.

    """
    given = state_dict
    resident = _resident_state(model) if given is None else {}

    def weights() -> Mapping[str, torch.Tensor]:
        return given if given is not None else {n: t.to(CPU) for n, t in resident.items()}

    return _offload_whole_model(
        model,
        "cpu_offload",
        execution_device,
        offload_buffers,
        preload_module_classes,
        held=given if given is not None else resident,
        where="state_dict",
        fix="pass state_dict= with their weights",
        weights=weights,
    )


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Move the whole model to ``execution_device`` when called; it stays there until offloaded.

    Cheaper than :func:`cpu_offload` for a model called in a loop (one transfer, not one per
    call). Chain pipelines by passing the previous model's hook as ``prev_module_hook``.

    Returns:
        The model and a hook whose ``offload()`` sends it back to the CPU.

    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(
    model: nn.Module,
    offload_dir: PathLike,
    execution_device: int | str | torch.device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: Iterable[str] | None = None,
) -> nn.Module:
    """Keep the weights in ``offload_dir`` and read each module's in for its forward.

    The weights are written there first unless the folder already has an ``index.json``; tensors
    on ``meta`` (no data) must be in that index.

    Args:
        model: The model.
        offload_dir: The folder of the offloaded weights.
        execution_device: Where the forward runs (default: the device of the first parameter
            not on ``meta``, else the CPU).
        offload_buffers: Offload buffers too.
        preload_module_classes: Classes whose sub-module weights load all at once.

    Returns:
        The hooked model; outputs come back on the device of the inputs.

    Raises:
        StateDictMismatchError: A tensor is on ``meta`` and ``offload_dir`` has no data for it.

    """
    folder = Path(offload_dir)
    written = (folder / INDEX_NAME).exists()

    def weights() -> Mapping[str, torch.Tensor]:
        if not written:
            offload_state_dict(folder, _resident_state(model))
        return OffloadedWeightsLoader(save_folder=folder)

    return _offload_whole_model(
        model,
        "disk_offload",
        execution_device,
        offload_buffers,
        preload_module_classes,
        held=read_offload_index(folder) if written else _resident_state(model),
        where=f"the offload folder ({folder})",
        fix="pass offload_dir= the folder they were offloaded to",
        weights=weights,
    )


def _check_loaded(
    model: nn.Module, device_map: Mapping[str, DeviceKey], missing: list[str], unexpected: list[str]
) -> None:
    tensors = dict(named_module_tensors(model, recurse=True))
    empty = [
        name
        for name in missing
        if name in tensors
        and tensors[name].device.type == "meta"
        and (not device_map or _device_of(name, device_map) != DISK)
    ]
    if not empty:
        return
    hints = {
        name: difflib.get_close_matches(name, unexpected, n=3, cutoff=0.4) for name in empty[:5]
    }
    raise StateDictMismatchError(
        f"The checkpoint has no weights for {len(empty)} tensor(s) of {type(model).__name__} that "
        f"are still empty (meta): {empty[:5]}. Checkpoint keys the model does not have, closest "
        f"first: {hints}. Rename the checkpoint keys or build the model with the matching "
        "configuration.",
        missing_keys=empty,
        unexpected_keys=unexpected,
    )


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: PathLike,
    device_map: str | Mapping[str, int | str | torch.device] | None = None,
    max_memory: Mapping[object, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: PathLike | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load a checkpoint into a (usually empty) model, tensor by tensor, and dispatch it.

    Example:
        >>> with init_empty_weights():
        ...     model = MyModel()
        >>> model = load_checkpoint_and_dispatch(
        ...     model, "checkpoint_folder", device_map="auto",
        ...     max_memory={0: "20GiB", "cpu": "30GiB"}, offload_folder="offload",
        ...     no_split_module_classes=["Block"])

    Args:
        model: The model to fill.
        checkpoint: A safetensors (or ``.bin``) file, a ``*.index.json`` or a folder.
        device_map: A dict, or ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"``
            to plan one with :func:`infer_auto_device_map`; ``None`` loads without dispatching.
        max_memory: Budget per device for the planning strategies.
        no_split_module_classes: Blocks that must stay on one device.
        offload_folder: Where weights planned for ``"disk"`` are written.
        offload_buffers: Offload buffers too.
        dtype: Load floating-point weights in this dtype.
        offload_state_dict: Accepted for compatibility (shards are always read one at a time).
        skip_keys: Input keys not moved between devices.
        preload_module_classes: Classes whose offloaded sub-module weights load at once.
        force_hooks: Hook the model even when it all lands on one device.
        strict: Raise on any missing or unexpected key.
        full_state_dict: As for :func:`~accel_ckpt.load_checkpoint_in_model` (DTensor models).
        broadcast_from_rank0: As for :func:`~accel_ckpt.load_checkpoint_in_model`.

    Returns:
        The dispatched model (``model.hf_device_map`` holds the plan).

    Raises:
        InsufficientMemoryError: The plan needs the disk but no ``offload_folder`` was given.
        DeviceMapError: Bad strategy name or device map.
        StateDictMismatchError: Weights the model needs are not in the checkpoint.

    """
    planned: dict[str, DeviceKey] | None = None
    if device_map is not None:
        planned = plan_device_map(
            model,
            device_map,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    if planned is not None and DISK in planned.values() and offload_folder is None:
        total = compute_module_sizes(model, dtype=dtype)[""]
        allowed = sum(v for k, v in get_max_memory(max_memory).items() if k != DISK)
        raise InsufficientMemoryError(
            f"The model needs {format_size(total)} but the devices may hold "
            f"{format_size(allowed)} (max_memory={dict(max_memory) if max_memory else 'free memory'}"
            f"), so part of it is planned for 'disk' ({[k for k, v in planned.items() if v == DISK][:5]}). "
            "Pass offload_folder='some/folder', or allow more memory."
        )
    mapping = (
        {key: _torch_device(value) if value != DISK else DISK for key, value in planned.items()}
        if planned is not None
        else None
    )
    keys = load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=mapping,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=bool(offload_state_dict),
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    _check_loaded(model, planned or {}, keys.missing_keys, keys.unexpected_keys)
    if planned is None:
        return model
    return dispatch_model(
        model,
        planned,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks or set(planned.values()) == {DISK},
    )
