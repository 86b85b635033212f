"""Accelerate's ``accelerate.utils.fsdp_common`` module path: a door to :mod:`accel.strategies.fsdp_common`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp_common import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.strategies.fsdp_common import (
    FSDPSettings as FSDPSettings,
)
from accel.strategies.fsdp_common import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)
from accel.strategies.fsdp_common import (
    PathLike,
    adapter_weights_only,
    get_parameters_from_modules,
    resolve_plugin,
    select_modules,
)

__all__ = [
    "PathLike",
    "adapter_weights_only",
    "get_parameters_from_modules",
    "resolve_plugin",
    "select_modules",
]

serve_as_door(__name__, "accel.strategies.fsdp_common")
