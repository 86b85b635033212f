"""How much memory each device may use: ``max_memory`` dictionaries, parsed and defaulted."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

import torch

from accel_ckpt.errors import DeviceMapError, InvalidArgumentError
from accel_ckpt.sizes import parse_size
from accel_state.torch_compat import accelerator_module

#: A device key of ``max_memory`` / a device map value: a GPU index, "cpu", "disk", "cuda:1"...
DeviceKey = int | str
DISK = "disk"
CPU = "cpu"


def _accelerator_type() -> str | None:
    accelerator = accelerator_module()
    if accelerator is not None and accelerator.is_available():
        current = accelerator.current_accelerator()
        if current is not None and current.type not in (CPU, "meta"):
            return str(current.type)
    return "cuda" if torch.cuda.is_available() else None


def normalize_device_key(key: object, argument: str = "max_memory") -> DeviceKey:
    """``"cuda:1"`` -> ``1``, ``torch.device("cpu")`` -> ``"cpu"``; ints, "cpu", "disk" pass.

    Raises:
        DeviceMapError: ``key`` names no device.

    """
    if isinstance(key, torch.device):
        key = str(key)
    if isinstance(key, int) and not isinstance(key, bool):
        if key < 0:
            raise DeviceMapError(f"{argument} names GPU {key}; GPU indexes start at 0.")
        return key
    if isinstance(key, str):
        if key in (CPU, DISK, "mps"):
            return key
        kind, _, index = key.partition(":")
        if kind in ("cuda", "xpu", "npu", "mlu", "musa", "hpu") and (index.isdigit() or not index):
            return int(index or 0)
        if key.isdigit():
            return int(key)
    raise DeviceMapError(
        f"{argument} names the unknown device {key!r}; use a GPU index (0, 1, ...), 'cuda:0', "
        "'cpu' or 'disk'."
    )


def _parse_amount(key: DeviceKey, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidArgumentError(
            f"max_memory[{key!r}]={value!r} is not a size; use bytes or a string like '10GiB'."
        )
    if isinstance(value, float):
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise InvalidArgumentError(f"max_memory[{key!r}]={value} must not be negative.")
        return value
    try:
        return parse_size(value)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"max_memory[{key!r}]={value!r} is not a size; use e.g. '10GiB', '500MB' or bytes."
        ) from None


def available_cpu_memory() -> int:
    """Bytes of host memory available now (``MemAvailable``; psutil when installed)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _device_module(kind: str) -> Any:
    return getattr(torch, kind)


def get_max_memory(max_memory: Mapping[object, int | str] | None = None) -> dict[DeviceKey, int]:
    """Bytes each device may use: parsed from ``max_memory``, or what is free now.

    Without ``max_memory``: the free memory of every visible GPU (in index order) and the
    available host memory under ``"cpu"``. Given one, its sizes are parsed (``"10GiB"``) and its
    keys normalised (``"cuda:1"`` -> ``1``); GPUs come first, in order, then ``"cpu"`` and
    ``"disk"``. As in Accelerate, size strings in a given mutable mapping are also replaced by
    their bytes in place (under the caller's keys). GPUs are not checked against the visible ones
    here (plans can be made for another machine); :func:`dispatch_model` checks them.

    Raises:
        DeviceMapError: A key names no device.
        InvalidArgumentError: A value is not a size.

    """
    kind = _accelerator_type()
    count = visible_gpu_count()
    if max_memory is None:
        result: dict[DeviceKey, int] = {}
        for index in range(count):
            module = _device_module(kind or "cuda")
            mem_get_info = getattr(module, "mem_get_info", None)
            if mem_get_info is not None:
                result[index] = int(mem_get_info(index)[0])
            else:  # pragma: no cover - accelerators without mem_get_info
                result[index] = int(module.get_device_properties(index).total_memory)  # type: ignore[attr-defined]
        result[CPU] = available_cpu_memory()
        return result
    parsed: dict[DeviceKey, int] = {}
    in_place: dict[object, int] = {}
    for key, value in max_memory.items():
        device = normalize_device_key(key)
        parsed[device] = _parse_amount(device, value)
        if isinstance(value, str):
            in_place[key] = parsed[device]
    if isinstance(max_memory, MutableMapping):
        # Accelerate converts the caller's size strings in place, and transformers compares the
        # caller's dict with the result afterwards (its from_pretrained(max_memory=...)).
        max_memory.update(in_place)
    return order_devices(parsed)


def visible_gpu_count() -> int:
    """How many GPUs (of the current accelerator type) this process sees."""
    kind = _accelerator_type()
    return int(_device_module(kind).device_count()) if kind is not None else 0


def check_devices_exist(devices: Iterable[DeviceKey], argument: str = "device_map") -> None:
    """Raise when ``devices`` names a GPU this process cannot see.

    Raises:
        DeviceMapError: The message names the GPU and how many are visible.

    """
    count = visible_gpu_count()
    for device in devices:
        if isinstance(device, int) and device >= count:
            raise DeviceMapError(
                f"{argument} uses GPU {device} but {count} GPU(s) are visible; plan with "
                "max_memory for the GPUs you have, or check CUDA_VISIBLE_DEVICES."
            )


def order_devices(memory: Mapping[DeviceKey, int]) -> dict[DeviceKey, int]:
    """``memory`` with GPUs first (by index), then mps, cpu and disk."""
    rank = {"mps": 1, CPU: 2, DISK: 3}

    def sort_key(key: DeviceKey) -> tuple[int, int]:
        return (0, key) if isinstance(key, int) else (rank.get(key, 4), 0)

    return {key: memory[key] for key in sorted(memory, key=sort_key)}
