"""Lower-level model helpers of Accelerate's ``accelerate.utils``: tied weights, state dicts.

Reading one weights file (``load_state_dict``), storage identity and shared-tensor cleanup for
safetensors, re-tying parameters after loading, tied-weight checks, offloaded-weight reload,
and a module walk from the leaves up.

Example:
    >>> import torch
    >>> from accel_ckpt.big_modeling.model_helpers import get_module_children_bottom_up
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> [type(m).__name__ for m in get_module_children_bottom_up(model)]
    ['Linear', 'Sequential']
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_ckpt.big_modeling.hooks import offloading_hook
from accel_ckpt.big_modeling.offload import load_offloaded_weight
from accel_ckpt.big_modeling.planning import (
    DtypeLike,
    compute_module_sizes,
    get_max_layer_size,
)
from accel_ckpt.big_modeling.tensors import set_module_tensor_to_device

PathLike = str | os.PathLike[str]

# Accelerate logs from ``accelerate.utils.modeling``; accel's twin of that name.
logger = logging.getLogger("accel.utils.modeling")
# Accelerate reports the shared-tensor cleanup on ``accelerate.utils.other``.
_other_logger = logging.getLogger("accel.utils.other")


def _placement(name: str, device_map: Mapping[str, Any]) -> Any:
    """The device of ``name`` in ``device_map`` (longest matching module prefix), else None."""
    best: tuple[int, Any] = (-1, None)
    for key, device in device_map.items():
        if (key == "" or name == key or name.startswith(key + ".")) and len(key) > best[0]:
            best = (len(key), device)
    return best[1]


def load_state_dict(
    checkpoint_file: PathLike, device_map: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """Read one weights file (``.safetensors``, or a ``torch.save`` file) into a state dict.

    Args:
        checkpoint_file: The file.
        device_map: Optional module name -> device; each tensor is read onto the device of its
            module (``"disk"`` and unmapped tensors are read onto the CPU).

    Raises:
        FileNotFoundError: ``checkpoint_file`` does not exist.
    """
    path = Path(checkpoint_file)
    if not path.is_file():
        raise FileNotFoundError(f"load_state_dict(checkpoint_file={os.fspath(path)!r}): no file.")
    if path.suffix != ".safetensors":
        loaded: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
        return loaded
    from safetensors import safe_open

    result: dict[str, torch.Tensor] = {}
    with safe_open(os.fspath(path), framework="pt") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensor = handle.get_tensor(name)
            device = _placement(name, device_map) if device_map is not None else None
            if device is not None and device != "disk":
                tensor = tensor.to(device)
            result[name] = tensor
    return result


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, storage pointer, storage bytes)``: equal for tensors sharing one storage."""
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def clean_state_dict_for_safetensors(
    state_dict: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Drop all but the first name of tensors sharing storage and make the rest contiguous.

    safetensors refuses shared storage; tied weights are restored after loading by
    :func:`retie_parameters`. Modifies and returns ``state_dict`` and warns naming what it drops.
    """
    groups: dict[tuple[torch.device, int, int], list[str]] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            groups.setdefault(id_tensor_storage(tensor), []).append(name)
    dropped = [name for names in groups.values() for name in names[1:]]
    for name in dropped:
        del state_dict[name]
    if dropped:
        _other_logger.warning(
            "Removed shared tensor %s while saving. This should be OK, but check by verifying "
            "that you don't receive any warning while reloading; they are tied to the kept "
            "names and are restored by retie_parameters (or the model's tie_weights) on load.",
            set(dropped),
        )
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            state_dict[name] = tensor.contiguous()
    return state_dict


def extract_submodules_state_dict(
    state_dict: Mapping[str, Any], submodule_names: Sequence[str]
) -> dict[str, Any]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names`` (or are one)."""
    return {
        key: value
        for key, value in state_dict.items()
        if any(key == name or key.startswith(name + ".") for name in submodule_names)
    }


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module of ``model``, each after all its descendants; ``model`` comes last.

    Args:
        model: The root module.
        return_fqns: Return ``(qualified name, module)`` pairs (the root's name is ``""``).
    """
    stack: list[tuple[str, nn.Module]] = [("", model)]
    visited: list[tuple[str, nn.Module]] = []
    while stack:
        name, module = stack.pop()
        visited.append((name, module))
        stack.extend(
            (f"{name}.{child_name}" if name else child_name, child)
            for child_name, child in module.named_children()
        )
    ordered = visited[::-1]
    return list(ordered) if return_fqns else [module for _, module in ordered]


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    module_path, _, attribute = name.rpartition(".")
    return (model.get_submodule(module_path) if module_path else model), attribute


def retie_parameters(model: nn.Module, tied_params: Sequence[Sequence[str]]) -> None:
    """Make each group of names in ``tied_params`` one shared parameter again (in place).

    The first parameter of a group that is not on the meta device becomes every name's
    parameter; a group whose parameters are all on meta is left as it is.

    Args:
        model: The model.
        tied_params: Groups of parameter names, as returned by ``find_tied_parameters``.
    """
    for group in tied_params:
        shared: nn.Parameter | None = None
        for name in group:
            module, attribute = _owner(model, name)
            candidate = getattr(module, attribute)
            if candidate.device.type != "meta":
                shared = candidate
                break
        if shared is None:
            continue
        for name in group:
            module, attribute = _owner(model, name)
            setattr(module, attribute, shared)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a transformers model's config ties weights (word embeddings, encoder-decoder).

    Plain torch modules have no such config and give ``False``.
    """
    classes = [cls.__name__ for cls in inspect.getmro(type(model))]
    if "PreTrainedModel" not in classes:
        return False
    config = getattr(model, "config", None)
    output_embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    tied_embeddings = bool(getattr(config, "tie_word_embeddings", False)) and (
        output_embeddings is not None
    )
    tied_encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)) and bool(
        getattr(config, "tie_encoder_decoder", False)
    )
    tied_module = any(hasattr(module, "_tie_weights") for module in model.modules())
    return tied_embeddings or tied_encoder_decoder or tied_module


def check_tied_parameters_on_same_device(
    tied_params: Sequence[Sequence[str]], device_map: Mapping[str, Any]
) -> None:
    """Warn for each group of tied parameters that ``device_map`` spreads over several devices."""
    for group in tied_params:
        devices = {str(_placement(name, device_map)) for name in group}
        if len(devices) > 1:
            warnings.warn(
                f"Tied parameters {list(group)} are on different devices ({sorted(devices)}) "
                "in the device map; put their modules on one device or they are untied.",
                stacklevel=2,
            )


def load_offloaded_weights(
    model: nn.Module, index: Mapping[str, Mapping[str, Any]], offload_folder: PathLike
) -> None:
    """Put the weights offloaded to ``offload_folder`` back into ``model`` on the CPU.

    Args:
        model: The model (its offloaded weights are usually on meta).
        index: Name -> ``{"dtype", "shape"}``, the folder's ``index.json``.
        offload_folder: Folder of the ``<name>.dat`` files.
    """
    if not index:
        return
    for name, info in index.items():
        weight = load_offloaded_weight(Path(offload_folder) / f"{name}.dat", info)
        set_module_tensor_to_device(model, name, "cpu", value=weight)


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(total bytes, (largest layer's bytes, its names))`` of ``model``'s weights.

    A layer is a direct child, or a module of a class in ``model._no_split_modules`` found
    inside one.
    """
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    top_level: list[tuple[str, nn.Module]] = [
        *model.named_parameters(recurse=False),  # type: ignore[list-item]
        *model.named_children(),
        *model.named_buffers(recurse=False),  # type: ignore[list-item]
    ]
    largest = get_max_layer_size(top_level, sizes, no_split)
    return sizes[""], largest


@contextlib.contextmanager
def align_module_device(
    module: nn.Module, execution_device: torch.device | None = None
) -> Iterator[None]:
    """Inside the block, ``module``'s own weights are on ``execution_device`` (or loaded).

    An offloaded module (weights brought in by its hook) gets them loaded for the block and
    offloaded again after; otherwise with ``execution_device`` the module's own parameters move
    there and back. Without either nothing happens.
    """
    hook = offloading_hook(module)
    if hook is not None:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = torch.device(execution_device)
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        originals = {name: param.detach() for name, param in module.named_parameters(recurse=False)}
        try:
            for name in originals:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, kept in originals.items():
                set_module_tensor_to_device(module, name, kept.device, value=kept)
    else:
        yield


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """Whether two devices are the same, ``cuda`` counting as ``cuda:0`` (and so on)."""
    if first_device.type != second_device.type:
        return False

    def indexed(device: torch.device) -> torch.device:
        if device.type != "cpu" and device.index is None:
            return torch.device(device.type, 0)
        return device

    return indexed(first_device) == indexed(second_device)


def get_non_persistent_buffers(
    module: nn.Module, recurse: bool = False, fqns: bool = False
) -> set[str]:
    """Names of the buffers of ``module`` that ``state_dict()`` leaves out.

    Args:
        module: The module.
        recurse: Also look in every sub-module.
        fqns: With ``recurse``, give sub-modules' buffers by their dotted names.
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            if fqns:
                names |= {f"{prefix}.{leaf}" for leaf in sub._non_persistent_buffers_set}
            else:
                names |= sub._non_persistent_buffers_set
    return names


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: DtypeLike | None = None,
    special_dtypes: Mapping[str, DtypeLike] | None = None,
) -> int:
    """Bytes of all the buffers of ``model`` (floating-point ones counted at ``dtype``)."""
    sizes = compute_module_sizes(
        model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True
    )
    return sizes.get("", 0)


def get_module_size_with_ties(
    tied_params: Sequence[str],
    module_size: int,
    module_sizes: Mapping[str, int],
    modules_to_treat: Sequence[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """Size of a module together with the modules its tied parameters live in.

    Args:
        tied_params: Names of the parameters tied to the module's, living in other modules.
        module_size: Bytes of the module alone.
        module_sizes: Bytes by module (and tensor) name, as from ``compute_module_sizes``.
        modules_to_treat: ``(name, module)`` still to place; each tied parameter's module is
            looked up there.

    Returns:
        The combined size (tied tensors counted once), the names of the tied modules and the
        modules.

    Raises:
        ValueError: A tied parameter lies in none of ``modules_to_treat``.
    """
    if not tied_params:
        return module_size, [], []
    names: list[str] = []
    modules: list[nn.Module] = []
    for param in tied_params:
        found = [(n, m) for n, m in modules_to_treat if param.startswith(n + ".")]
        if not found:
            raise ValueError(
                f"tied_params names {param!r}, which is in none of modules_to_treat "
                f"({[n for n, _ in modules_to_treat][:10]}); pass the module that holds it."
            )
        names.append(found[0][0])
        modules.append(found[0][1])
    total = module_size
    for param, name in zip(tied_params, names, strict=True):
        total += module_sizes[name] - module_sizes[param]
    return total, names, modules


def get_module_leaves(module_sizes: Mapping[str, int]) -> list[str]:
    """Names in ``module_sizes`` that have no entry below them (the root excluded)."""
    children: dict[str, int] = {}
    for name in module_sizes:
        if name and "." in name:
            parent = name.rsplit(".", 1)[0]
            children[parent] = children.get(parent, 0) + 1
    return [name for name in module_sizes if name and not children.get(name, 0)]


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a model whose weights are (partly) offloaded, on the CPU.

    Each sub-module's offloaded weights are brought in one at a time (so only one module's
    weights are in memory at once besides the result). Tensors that stay on the meta device
    (placeholders with no offloaded copy) are left out with a warning.

    Raises:
        MemoryError: An offloaded module does not fit in CPU memory.
    """
    state: dict[str, torch.Tensor] = {}
    placeholders: set[str] = set()
    for name, module in model.named_modules():
        if name == "":
            continue
        try:
            with align_module_device(module, torch.device("cpu")):
                module_state = module.state_dict()
        except MemoryError:
            raise MemoryError(
                "Offloaded module must fit in CPU memory to call save_model!"
            ) from None
        for key, tensor in module_state.items():
            full = f"{name}.{key}"
            if tensor.device.type == "meta":
                placeholders.add(full)
                continue
            state[full] = tensor.to("cpu")
    for name, tensor in model.state_dict().items():
        if name not in state and tensor.device.type != "meta":
            state[name] = tensor.to("cpu")  # the root's own tensors
    placeholders -= state.keys()
    if placeholders:
        logger.warning(
            "The following tensors were not saved because they were still on meta device: %s",
            placeholders,
        )
    return state


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, Any],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, Any]:
    """Fill ``state_dict``'s entries of ``module`` with its weights, loaded if offloaded.

    Args:
        module: The (sub-)module.
        module_name: The dotted name of one of its tensors (``"layer.weight"``): entries under
            its parent prefix are filled.
        state_dict: Name -> value; only names already there are replaced.
        device_to_put_offload: Where offloaded weights are loaded (unused if not offloaded).

    Returns:
        ``state_dict``, updated in place.
    """
    root = module_name[: module_name.rfind(".")]
    target: torch.device | None = None
    if offloading_hook(module) is not None:
        target = (
            torch.device("cuda", device_to_put_offload)
            if isinstance(device_to_put_offload, int)
            else torch.device(device_to_put_offload)
        )
    with align_module_device(module, target):
        for key, value in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = value
    return state_dict


__all__ = [
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_state_dict_for_safetensors",
    "compute_module_total_buffer_size",
    "extract_submodules_state_dict",
    "get_module_children_bottom_up",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "id_tensor_storage",
    "load_offloaded_weights",
    "load_state_dict",
    "retie_parameters",
]


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class of the first module named ``name`` (class name) in ``module``'s tree, or None.

    ``module`` itself is checked first, then its children depth first, in registration order
    (FSDP auto-wrap policies turn layer class names into classes this way).
    """
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None
