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
import warnings
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
from accel_ckpt.big_modeling.tensors import (
    find_tied_parameters,
    named_module_tensors,
    tensor_nbytes,
)
from accel_ckpt.dtypes import CustomDtype
from accel_ckpt.errors import DeviceMapError
from accel_ckpt.placement import resolve_dtype
from accel_ckpt.sizes import format_size, parse_size

# Accelerate logs from ``accelerate.utils.modeling``; accel's twin of that name.
logger = logging.getLogger("accel.utils.modeling")

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


def _outside_ties(name: str, tied_groups: list[list[str]]) -> list[str]:
    """Parameters tied to a parameter inside ``name`` that live outside it."""
    inside = [group for group in tied_groups if any(_within(k, name) for k in group)]
    return [
        k
        for group in inside
        if not all(_within(x, name) for x in group)
        for k in group
        if not _within(k, name)
    ]


def _within(key: str, prefix: str) -> bool:
    return (key + ".").startswith(prefix + ".")


def _split(name: str, module: nn.Module) -> list[_Item]:
    """A module's own parameters and children, named in the model (its buffers go with it)."""
    prefix = f"{name}." if name else ""
    items: list[_Item] = [(prefix + n, p) for n, p in module.named_parameters(recurse=False)]
    return items + [(prefix + n, c) for n, c in module.named_children()]


def _splittable(obj: nn.Module | torch.Tensor, no_split: set[str]) -> bool:
    return (
        isinstance(obj, nn.Module)
        and not isinstance(obj, torch.Tensor)
        and type(obj).__name__ not in no_split
        and next(obj.children(), None) is not None
    )


def _size_with_ties(
    tied: list[str], size: int, sizes: Mapping[str, int], queue: list[_Item]
) -> tuple[int, list[str]]:
    """``size`` plus the modules (in ``queue``) holding ``tied``, tied tensors counted once."""
    names: list[str] = []
    total = size
    for param in tied:
        holder = next((n for n, _ in queue if param.startswith(n + ".")), None)
        if holder is None:
            continue  # already placed
        names.append(holder)
        total += sizes[holder] - sizes[param]
    return total, names


def _fallback(
    queue: list[_Item],
    sizes: Mapping[str, int],
    limit: int,
    no_split: set[str],
    tied_groups: list[list[str]],
) -> tuple[_Item | None, list[_Item]]:
    """A module of ``queue`` (searched breadth-first, splitting) that fits in ``limit`` bytes.

    Returns it and the queue without it (its ancestors in the queue replaced by their parts),
    or ``(None, queue)``.
    """
    if limit < 0:
        return None, queue
    search = list(queue)
    found: _Item | None = None
    while search:
        name, obj = search.pop(0)
        total, _ = _size_with_ties(_outside_ties(name, tied_groups), sizes[name], sizes, search)
        if total <= limit:
            found = (name, obj)
            break
        if _splittable(obj, no_split):
            search = _split(name, obj) + search  # type: ignore[arg-type]
    if found is None:
        return None, queue
    rest = list(queue)
    parts = found[0].split(".")
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        names = [n for n, _ in rest]
        if parent in names:
            index = names.index(parent)
            rest[index : index + 1] = _split(parent, rest[index][1])  # type: ignore[arg-type]
    names = [n for n, _ in rest]
    return rest.pop(names.index(found[0])), rest


def fallback_allocate(
    modules: list[tuple[str, nn.Module]],
    module_sizes: dict[str, int],
    size_limit: int | str,
    no_split_module_classes: list[str] | None = None,
    tied_parameters: list[list[str]] | None = None,
) -> tuple[str | None, nn.Module | None, list[tuple[str, nn.Module]]]:
    """Find a module of ``modules`` that fits in ``size_limit`` (Accelerate's fallback step).

    ``modules`` is searched breadth-first: a module too big is replaced by its own parameters and
    children (unless its class is in ``no_split_module_classes``), and the first one whose size,
    with the modules holding parameters tied to it (``tied_parameters``), fits is taken.
    ``infer_auto_device_map(fallback_allocation=True)`` uses this to put something on a device
    the next whole module does not fit on.

    Args:
        modules: ``(name, module)`` pairs, names as in the model.
        module_sizes: Bytes per name, as :func:`compute_module_sizes` returns.
        size_limit: Bytes, or a size such as ``"2GB"``; a negative int finds nothing.
        no_split_module_classes: Class names never split.
        tied_parameters: Groups of tied parameter names (:func:`find_tied_parameters`).

    Returns:
        The found module's name, the module, and ``modules`` without it (its ancestors there
        replaced by their parts); ``(None, None, modules)`` when nothing fits.

    Raises:
        ValueError: ``size_limit`` is a string that is not a size.
    """
    limit = size_limit if isinstance(size_limit, int) else parse_size(size_limit, "size_limit")
    queue: list[_Item] = list(modules)
    found, rest = _fallback(
        queue,
        module_sizes,
        limit,
        set(no_split_module_classes or []),
        [list(group) for group in tied_parameters or []],
    )
    if found is None:
        return None, None, modules
    # Split parents leave their own parameters in the list too, as in Accelerate.
    return found[0], found[1], rest  # type: ignore[return-value]


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[object, int | str] | None = None,
    no_split_module_classes: Iterable[str] | str | None = None,
    dtype: DtypeLike | None = None,
    special_dtypes: Mapping[str, DtypeLike] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Plan a device map for ``model`` within ``max_memory`` (GPUs in order, then cpu, then disk).

    Modules are taken in definition order and put on the current device while they fit; one that
    does not is split into its parameters and children (unless it is a leaf or its class is in
    ``no_split_module_classes``), else the next device is opened. A module is placed together
    with the modules holding weights tied to its own; when only those do not fit, they are split
    first. The main devices (first GPU, CPU) keep room for the largest layer still to place.

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
        offload_buffers: Buffers of offloaded modules stay offloaded; without it they are all
            brought to a GPU, and a warning says when they fit on none.
        fallback_allocation: When the next module does not fit on a device that holds nothing
            yet, put there the first smaller module that does (breadth-first search).

    Returns:
        Module (or tensor) name -> GPU index, ``"cpu"`` or ``"disk"``, in model order.

    """
    memory = get_max_memory(max_memory)
    devices: list[DeviceKey] = [key for key in memory if key != DISK] + [DISK]
    gpus = [key for key in devices if key not in (CPU, DISK)]
    main_devices: list[DeviceKey] = (
        ["mps"] if "mps" in gpus else ([gpus[0], CPU] if gpus else [CPU])
    )
    if isinstance(no_split_module_classes, str):
        no_split_module_classes = [no_split_module_classes]
    no_split = set(no_split_module_classes or [])
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_groups = find_tied_parameters(model)
    queue: list[_Item] = [
        *model.named_parameters(recurse=False),
        *model.named_children(),
        *model.named_buffers(recurse=False),
    ]

    def largest_layer() -> tuple[int, list[str]]:
        return get_max_layer_size(
            [(n, m) for n, m in queue if isinstance(m, nn.Module)], sizes, no_split
        )

    layer_size, layer_names = get_max_layer_size(
        [(n, m) for n, m in queue if isinstance(m, nn.Module)], sizes, no_split
    )
    device_map: dict[str, DeviceKey] = {}
    used: dict[DeviceKey, int] = dict.fromkeys(devices, 0)
    buffers: dict[DeviceKey, int] = {}
    minimum: dict[DeviceKey, int] = {}
    index = 0
    while queue:
        name, obj = queue.pop(0)
        layer_names = [n for n in layer_names if not _within(n, name)]
        if not layer_names:
            layer_size, layer_names = largest_layer()
        size = sizes[name]
        tied = _outside_ties(name, tied_groups)
        device = devices[index]
        room: int | None = None if device == DISK else memory[device]
        reserved = 0
        if device in main_devices and room is not None:
            room -= layer_size
            reserved = layer_size
        with_ties, tied_names = _size_with_ties(tied, size, sizes, queue)
        if room is None or used[device] + with_ties <= room:
            if verbose:
                logger.info(
                    "Putting %s%s on %s.", name, f" and {tied_names}" if tied_names else "", device
                )
            used[device] += with_ties
            device_map[name] = device
            for tied_name in tied_names:
                queue = [(n, m) for n, m in queue if n != tied_name]
                device_map[tied_name] = device
            if not offload_buffers and isinstance(obj, nn.Module):
                buffers[device] = buffers.get(device, 0) + compute_module_sizes(
                    obj, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True
                ).get("", 0)
            continue
        assert room is not None  # the disk takes everything
        if tied and used[device] + size <= room:
            split_one = False
            for tied_name in tied_names:
                position = next(i for i, (n, _) in enumerate(queue) if n == tied_name)
                tied_module = queue[position][1]
                if not _splittable(tied_module, no_split):
                    continue
                if verbose:
                    logger.info("Splitting %s (tied to %s).", tied_name, name)
                queue[position : position + 1] = _split(tied_name, tied_module)  # type: ignore[arg-type]
                queue.insert(0, (name, obj))
                layer_size, layer_names = largest_layer()
                split_one = True
                break
            if split_one:
                continue
        if used[device] + size >= room and _splittable(obj, no_split):
            if verbose:
                logger.info(
                    "Splitting %s (%s does not fit on %s).", name, format_size(size), device
                )
            queue = _split(name, obj) + queue  # type: ignore[arg-type]
            layer_size, layer_names = largest_layer()
            continue
        if used[device] == 0 and fallback_allocation and device != DISK:
            limit = memory[device] - max(layer_size, with_ties)
            found, rest = _fallback(queue, sizes, limit, no_split, tied_groups)
            if found is not None:
                queue = [found, (name, obj), *rest]
                continue
        if used[device] == 0:
            minimum[device] = with_ties + reserved
        if verbose:
            logger.info("%s is full; moving on to %s.", device, devices[index + 1])
        used[device] += reserved
        index += 1
        queue.insert(0, (name, obj))
    ordered = _in_model_order(model, device_map)
    result = clean_device_map(ordered) if clean_result else ordered
    offloaded_buffers = buffers.get(CPU, 0) + buffers.get(DISK, 0)
    if offloaded_buffers > 0 and not offload_buffers and gpus:
        fits = any(memory[gpu] >= offloaded_buffers + used.get(gpu, 0) for gpu in gpus)
        if not fits:
            warnings.warn(
                f"Current model requires {offloaded_buffers} bytes of buffer for offloaded "
                "layers, which seems does not fit any GPU's remaining memory. If you are "
                "experiencing a OOM later, please consider using offload_buffers=True.",
                stacklevel=2,
            )
    if minimum:
        details = "\n".join(
            f"  - {device}: {need} bytes required" for device, need in minimum.items()
        )
        logger.info(
            "Based on the current allocation process, no modules could be assigned to the "
            "following devices due to insufficient memory:\n%s\nThese minimum requirements are "
            "specific to this allocation attempt and may vary. Consider increasing the available "
            "memory for these devices to at least the specified minimum, or adjusting the model "
            "config.",
            details,
        )
    return result


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


def check_device_map(
    model: nn.Module, device_map: Mapping[str, object], *, strict_keys: bool = False
) -> None:
    """Check that ``device_map`` covers every saved tensor and names only real devices.

    Non-persistent buffers may be left out (they stay where they are).

    A key that names no module or tensor of the model places nothing: it is reported with a
    ``UserWarning`` (with the closest names), as Accelerate does, or raised with
    ``strict_keys`` (``dispatch_model`` and ``load_checkpoint_and_dispatch`` use that: a typo
    there would leave a module where the map did not mean it).

    Raises:
        DeviceMapError: A tensor is not covered (the message lists them), a value is not a
            device, or (with ``strict_keys``) a key names nothing in the model.

    """
    for key, value in device_map.items():
        normalize_device_key(value, f"device_map[{key!r}]")
    names = [
        name for name, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)
    ]
    known = {name for name, _ in named_module_tensors(model, recurse=True)}
    known |= {name for name, _ in model.named_modules()}
    unknown = [key for key in device_map if key and key not in known]
    if unknown and strict_keys:
        hints = {key: difflib.get_close_matches(key, known, n=3) for key in unknown[:5]}
        raise DeviceMapError(
            f"device_map names {unknown[:5]}, which are not modules or tensors of "
            f"{type(model).__name__}; closest names: {hints}. Fix the keys (they are module "
            "names as in model.named_modules())."
        )
    if unknown:
        hints = {key: difflib.get_close_matches(key, known, n=3) for key in unknown[:5]}
        warnings.warn(
            "The following device_map keys do not match any submodules in the model: "
            f"{unknown} (closest names: {hints}). They place nothing; fix the keys (module "
            "names as in model.named_modules()).",
            UserWarning,
            stacklevel=2,
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
