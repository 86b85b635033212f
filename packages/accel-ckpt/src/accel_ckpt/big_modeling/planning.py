"""Planning where each module goes: module sizes, balanced budgets and the automatic device map.

:func:`infer_auto_device_map` walks the model top-down in definition order and fills the devices
one after the other (GPUs by index, then ``"cpu"``, then ``"disk"``). A module that does not fit
the room left is split into its children, unless it is a leaf or its class is listed in
``no_split_module_classes``, in which case the next device is opened. Weights tied to weights in
other modules are placed together with them. The main devices (the first GPU and the CPU) keep
room for the largest layer (leaf module or unsplittable block) not yet placed, unless everything
left fits there: offloaded layers are brought to them to run. On the models of the tests these
rules give the same maps as Accelerate's ``infer_auto_device_map``.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from accel_ckpt.big_modeling.memory import (
    CPU,
    DISK,
    DeviceKey,
    get_max_memory,
    normalize_device_key,
)
from accel_ckpt.big_modeling.tensors import named_module_tensors, tensor_nbytes
from accel_ckpt.dtypes import CustomDtype
from accel_ckpt.errors import DeviceMapError
from accel_ckpt.placement import resolve_dtype
from accel_ckpt.sizes import format_size

logger = logging.getLogger(__name__)

DtypeLike = str | torch.dtype | CustomDtype
SizingDtype = torch.dtype | CustomDtype
_Item = tuple[str, nn.Module | torch.Tensor]


def _sizing_dtype(dtype: DtypeLike | None) -> SizingDtype | None:
    return dtype if isinstance(dtype, CustomDtype) else resolve_dtype(dtype)


def _dtype_for(
    name: str, dtype: SizingDtype | None, special: Mapping[str, SizingDtype] | None
) -> SizingDtype | None:
    if special and name in special:
        return special[name]
    return dtype


def _resolve_special(special: Mapping[str, DtypeLike] | None) -> dict[str, SizingDtype] | None:
    if not special:
        return None
    return {name: d for name, value in special.items() if (d := _sizing_dtype(value)) is not None}


def compute_module_sizes(
    model: nn.Module,
    dtype: DtypeLike | None = None,
    special_dtypes: Mapping[str, DtypeLike] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every module (and tensor) of ``model`` by dotted name; ``""`` is the whole model.

    A ``defaultdict``: modules without tensors of their own count 0. Tied weights count once
    (under their first name). Floating-point tensors count at ``dtype``
    when given (``special_dtypes`` overrides it per tensor name); meta tensors count too.
    """
    resolved = _sizing_dtype(dtype)
    special = _resolve_special(special_dtypes)
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        size = tensor_nbytes(tensor, _dtype_for(name, resolved, special))
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            key = ".".join(parts[:depth])
            sizes[key] += size
    sizes[""] += 0
    return sizes


def _layers(module: nn.Module, name: str, no_split: set[str]) -> Iterable[tuple[str, nn.Module]]:
    children = list(module.named_children())
    if not children or type(module).__name__ in no_split:
        yield name, module
        return
    for child_name, child in children:
        yield from _layers(child, f"{name}.{child_name}" if name else child_name, no_split)


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]],
    module_sizes: Mapping[str, int],
    no_split_module_classes: Iterable[str],
) -> tuple[int, list[str]]:
    """The largest layer (leaf module or unsplittable block) among ``modules`` and its names."""
    no_split = set(no_split_module_classes)
    best, names = 0, []
    for root_name, root in modules:
        for name, _ in _layers(root, root_name, no_split):
            size = module_sizes.get(name, 0)
            if size > best:
                best, names = size, [name]
            elif size == best and size:
                names.append(name)
    return best, names


def _gpu_keys(memory: Mapping[DeviceKey, int]) -> list[int]:
    return [key for key in memory if isinstance(key, int)]


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[object, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: DtypeLike | None = None,
    special_dtypes: Mapping[str, DtypeLike] | None = None,
    low_zero: bool = False,
) -> dict[DeviceKey, int]:
    """A ``max_memory`` that spreads the model evenly over the GPUs (``"balanced"``).

    Every GPU but the last gets its share of the model plus the largest layer; the last keeps its
    full budget. With ``low_zero`` (``"balanced_low_0"``) GPU 0 only takes what the others
    cannot hold (it stays free for ``generate`` outputs and the like). One GPU or none: the
    budget is returned unchanged.
    """
    memory = get_max_memory(max_memory)
    gpus = [key for key in _gpu_keys(memory) if memory[key] > 0]
    if len(gpus) <= 1:
        return memory
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    layer, _ = get_max_layer_size(
        list(model.named_children()) or [("", model)], sizes, no_split_module_classes or []
    )
    sharing = gpus[1:] if low_zero else gpus
    share = math.ceil(sizes[""] / len(sharing)) + layer
    for key in sharing[:-1]:
        memory[key] = min(memory[key], share)
    if low_zero:
        others = sum(memory[key] for key in sharing)
        memory[gpus[0]] = min(memory[gpus[0]], max(0, sizes[""] - others))
    return memory


class _Tensors:
    """Tensor identities and sizes of the model, for placing tied weights together."""

    def __init__(
        self, model: nn.Module, dtype: SizingDtype | None, special: dict[str, SizingDtype] | None
    ) -> None:
        self.size: dict[int, int] = {}
        self.by_module: dict[int, set[int]] = {}
        for prefix, module in model.named_modules(remove_duplicate=False):
            for table in (module._parameters, module._buffers):
                for leaf, tensor in table.items():
                    if tensor is None:
                        continue
                    name = f"{prefix}.{leaf}" if prefix else leaf
                    self.size.setdefault(
                        id(tensor), tensor_nbytes(tensor, _dtype_for(name, dtype, special))
                    )

    def of(self, obj: nn.Module | torch.Tensor) -> set[int]:
        """Identities of the tensors in ``obj`` (itself when a tensor), tied ones included."""
        if isinstance(obj, torch.Tensor):
            return {id(obj)}
        key = id(obj)
        if key not in self.by_module:
            self.by_module[key] = {
                id(t)
                for m in obj.modules(remove_duplicate=False)
                for table in (m._parameters, m._buffers)
                for t in table.values()
                if t is not None
            }
        return self.by_module[key]


def _children(name: str, module: nn.Module) -> list[_Item]:
    prefix = f"{name}." if name else ""
    items: list[_Item] = [(prefix + n, p) for n, p in module.named_parameters(recurse=False)]
    items += [(prefix + n, c) for n, c in module.named_children()]
    items += [(prefix + n, b) for n, b in module.named_buffers(recurse=False)]
    return items


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[object, int | str] | None = None,
    no_split_module_classes: Iterable[str] | None = None,
    dtype: DtypeLike | None = None,
    special_dtypes: Mapping[str, DtypeLike] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Plan a device map for ``model`` within ``max_memory`` (GPUs in order, then cpu, then disk).

    Example:
        >>> with init_empty_weights():
        ...     model = MyModel()
        >>> infer_auto_device_map(model, max_memory={0: "10GiB", "cpu": "30GiB"},
        ...                       no_split_module_classes=["Block"])
        {'embed': 0, 'blocks.0': 0, ..., 'blocks.30': 'cpu', 'head': 'cpu'}

    Args:
        model: The model (usually with empty weights).
        max_memory: Bytes (or ``"10GiB"`` strings) per device; default: what is free now.
        no_split_module_classes: Class names of blocks that must stay on one device (blocks with
            residual connections, for instance).
        dtype: Size floating-point weights as this dtype (the dtype they will be loaded in).
        special_dtypes: Per-tensor dtypes overriding ``dtype``.
        verbose: Log every placement decision.
        clean_result: Merge modules whose children all landed on one device.
        offload_buffers: Accepted for compatibility; buffers are always planned with their module.
        fallback_allocation: Accepted for compatibility.

    Returns:
        Module (or tensor) name -> GPU index, ``"cpu"`` or ``"disk"``, in model order.

    """
    del offload_buffers, fallback_allocation
    memory = get_max_memory(max_memory)
    devices: list[DeviceKey] = [key for key in memory if key != DISK] + [DISK]
    no_split = set(no_split_module_classes or [])
    resolved = _sizing_dtype(dtype)
    tensors = _Tensors(model, resolved, _resolve_special(special_dtypes))
    gpus = _gpu_keys(memory)
    main_devices = {gpus[0], CPU} if gpus else {CPU}
    roots = list(model.named_children()) or [("", model)]
    layers = [
        (name, tensors.of(module))
        for root_name, root in roots
        for name, module in _layers(root, root_name, no_split)
    ]
    queue: list[_Item] = _children("", model) if not _no_split(model, no_split) else [("", model)]
    placed: dict[int, DeviceKey] = {}
    device_map: dict[str, DeviceKey] = {}
    index, used = 0, 0

    def reserve(device: DeviceKey, current: set[int]) -> int:
        """Room a main device keeps for the largest layer still to place (but not ``current``)."""
        if device not in main_devices:
            return 0
        left = sum(size for key, size in tensors.size.items() if key not in placed)
        if left <= memory[device] - used:
            return 0  # everything left fits here: nothing will be offloaded
        largest = 0
        for _, ids in layers:
            rest = ids - placed.keys() - current
            if rest:
                largest = max(largest, sum(tensors.size[key] for key in rest))
        return largest

    while queue:
        name, obj = queue[0]
        own = tensors.of(obj) - placed.keys()
        if not own:
            queue.pop(0)
            if isinstance(obj, nn.Module) and not tensors.of(obj):
                continue
            device_map[name] = placed[next(iter(tensors.of(obj)))]
            continue
        partners = [
            position for position in range(1, len(queue)) if tensors.of(queue[position][1]) & own
        ]
        group = set(own)
        for position in partners:
            group |= tensors.of(queue[position][1]) - placed.keys()
        needed = sum(tensors.size[key] for key in group)
        device = devices[index]
        if device == DISK or used + needed <= memory[device] - reserve(device, group):
            for position in [0, *partners]:
                device_map[queue[position][0]] = device
            for key in group:
                placed[key] = device
            used += needed
            if verbose:
                logger.info("Putting %s (%s) on %s.", name, format_size(needed), device)
            for position in sorted(partners, reverse=True):
                queue.pop(position)
            queue.pop(0)
            continue
        if (
            isinstance(obj, nn.Module)
            and not _no_split(obj, no_split)
            and next(obj.children(), None)
        ):
            if verbose:
                logger.info(
                    "Splitting %s (%s does not fit on %s).", name, format_size(needed), device
                )
            queue[0:1] = _children(name, obj)
            continue
        if verbose:
            logger.info("%s is full; moving on to %s.", device, devices[index + 1])
        index, used = index + 1, 0
    ordered = _in_model_order(model, device_map)
    return clean_device_map(ordered) if clean_result else ordered


def _no_split(module: nn.Module, no_split: set[str]) -> bool:
    return type(module).__name__ in no_split


def _in_model_order(model: nn.Module, device_map: dict[str, DeviceKey]) -> dict[str, DeviceKey]:
    """``device_map`` sorted as the planner walks a module: own parameters, children, buffers."""
    order: dict[str, int] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        order.setdefault(prefix, len(order))
        dotted = f"{prefix}." if prefix else ""
        for name, _ in module.named_parameters(recurse=False):
            order.setdefault(dotted + name, len(order))
        for name, child in module.named_children():
            walk(child, dotted + name)
        for name, _ in module.named_buffers(recurse=False):
            order.setdefault(dotted + name, len(order))

    walk(model, "")
    return {
        key: device_map[key] for key in sorted(device_map, key=lambda k: order.get(k, len(order)))
    }


def clean_device_map(
    device_map: Mapping[str, DeviceKey], module_name: str = ""
) -> dict[str, DeviceKey]:
    """Merge entries: a module whose tensors all go to one device gets a single entry.

    Keeps the order of the first entry of each merged group.
    """
    result = dict(device_map)

    def inside(key: str, prefix: str) -> bool:
        return prefix == "" or key == prefix or key.startswith(prefix + ".")

    def visit(prefix: str) -> None:
        keys = [key for key in result if inside(key, prefix)]
        if len(keys) > 1 and len({str(result[key]) for key in keys}) == 1:
            value = result[keys[0]]
            rebuilt: dict[str, DeviceKey] = {}
            for key, device in result.items():
                if key == keys[0]:
                    rebuilt[prefix] = value
                elif key not in keys:
                    rebuilt[key] = device
            result.clear()
            result.update(rebuilt)
            return
        start = len(prefix) + 1 if prefix else 0
        children = []
        for key in keys:
            if key != prefix:
                child = key[start:].split(".")[0]
                full = f"{prefix}.{child}" if prefix else child
                if full not in children:
                    children.append(full)
        for child in children:
            visit(child)

    visit(module_name)
    return result


def check_device_map(model: nn.Module, device_map: Mapping[str, object]) -> None:
    """Check that ``device_map`` covers every saved tensor and names only real devices.

    Non-persistent buffers may be left out (they stay where they are).

    Raises:
        DeviceMapError: A tensor is not covered (the message lists them), a key names no module
            or tensor of the model (with the closest names), or a value is not a device.

    """
    for key, value in device_map.items():
        normalize_device_key(value, f"device_map[{key!r}]")
    names = [
        name for name, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)
    ]
    known = {name for name, _ in named_module_tensors(model, recurse=True)}
    known |= {name for name, _ in model.named_modules()}
    unknown = [key for key in device_map if key and key not in known]
    if unknown:
        hints = {key: difflib.get_close_matches(key, known, n=3) for key in unknown[:5]}
        raise DeviceMapError(
            f"device_map names {unknown[:5]}, which are not modules or tensors of "
            f"{type(model).__name__}; closest names: {hints}. Fix the keys (they are module "
            "names as in model.named_modules())."
        )
    if "" in device_map:
        return
    missing = [
        name
        for name in names
        if not any(name == key or name.startswith(key + ".") for key in device_map)
    ]
    if missing:
        raise DeviceMapError(
            f"device_map does not place {len(missing)} tensor(s) of {type(model).__name__}: "
            f"{missing[:10]}{' ...' if len(missing) > 10 else ''}. Add their modules (or '' for "
            "everything else) to device_map, or build it with infer_auto_device_map."
        )


def main_device_of(device_map: Mapping[str, DeviceKey]) -> DeviceKey:
    """The device offloaded modules run on: the first GPU of the map, else the CPU."""
    for value in device_map.values():
        if value not in (CPU, DISK):
            return value
    return CPU
