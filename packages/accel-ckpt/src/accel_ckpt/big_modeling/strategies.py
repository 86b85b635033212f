"""A ``device_map`` argument turned into a device map: the one planner every loader uses.

``load_checkpoint_and_dispatch``, ``dispatch_model``, ``load_and_quantize_model`` and
``get_quantized_model_device_map`` all take a ``device_map`` that is either a strategy name or a
dict. A strategy is planned as Accelerate plans it: :func:`infer_auto_device_map` over the
``max_memory`` budget, balanced over the GPUs first by :func:`get_balanced_memory` unless it is
``"sequential"``. A dict is checked against the model and its values normalized. Either way,
the GPUs the map names must be visible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_ckpt.big_modeling.memory import DeviceKey, check_devices_exist, normalize_device_key
from accel_ckpt.big_modeling.planning import (
    DtypeLike,
    check_device_map,
    get_balanced_memory,
    infer_auto_device_map,
)
from accel_ckpt.errors import DeviceMapError

#: The names a ``device_map`` argument may take instead of a dict (Accelerate's).
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

DeviceMapArgument = str | Mapping[str, int | str | torch.device]


def normalize_device_map(
    model: nn.Module,
    device_map: Mapping[str, int | str | torch.device],
    *,
    strict_keys: bool = True,
) -> dict[str, DeviceKey]:
    """Check a device map dict against ``model`` and return it with normalized device keys.

    Args:
        model: The model the map places.
        device_map: Module (or tensor) name -> GPU index, device string, ``torch.device``
            or ``"disk"``.
        strict_keys: Raise on keys naming nothing in the model (else they are warned about).

    Raises:
        DeviceMapError: A tensor is not placed, a value is not a device, a GPU is not visible,
            or (with ``strict_keys``) a key names nothing in the model.
    """
    check_device_map(model, device_map, strict_keys=strict_keys)
    normalized = {
        key: normalize_device_key(value, f"device_map[{key!r}]")
        for key, value in device_map.items()
    }
    check_devices_exist(normalized.values())
    return normalized


def plan_device_map(
    model: nn.Module,
    device_map: DeviceMapArgument,
    *,
    max_memory: Mapping[object, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: DtypeLike | None = None,
    special_dtypes: Mapping[str, DtypeLike] | None = None,
    offload_buffers: bool = False,
    strict_keys: bool = True,
) -> dict[str, DeviceKey]:
    """The device map of ``model``: planned for a strategy name, checked for a dict.

    Args:
        model: The model (usually with empty weights).
        device_map: One of :data:`STRATEGIES`, or a dict (see :func:`normalize_device_map`).
        max_memory: Budget per device for a strategy (default: what is free now).
        no_split_module_classes: Blocks that must stay on one device.
        dtype: Size floating-point weights as this dtype.
        special_dtypes: Per-tensor sizing dtypes overriding ``dtype`` (quantized weights).
        offload_buffers: Buffers of offloaded modules stay offloaded (sizing of the GPUs).
        strict_keys: For a dict, raise on keys naming nothing in the model.

    Returns:
        Module (or tensor) name -> GPU index, ``"cpu"``, ``"mps"`` or ``"disk"``.

    Raises:
        DeviceMapError: An unknown strategy, a value of another type, or a bad dict.
    """
    if isinstance(device_map, Mapping):
        return normalize_device_map(model, device_map, strict_keys=strict_keys)
    if not isinstance(device_map, str) or device_map not in STRATEGIES:
        raise DeviceMapError(
            f"device_map={device_map!r} is not a strategy; use one of {list(STRATEGIES)} or a "
            "dict of module name -> device."
        )
    memory: Mapping[Any, Any] | None = max_memory
    if device_map != "sequential":
        memory = get_balanced_memory(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            special_dtypes=special_dtypes,
            low_zero=device_map == "balanced_low_0",
        )
    planned = infer_auto_device_map(
        model,
        max_memory=memory,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        special_dtypes=special_dtypes,
        offload_buffers=offload_buffers,
    )
    check_devices_exist(planned.values())
    return planned
