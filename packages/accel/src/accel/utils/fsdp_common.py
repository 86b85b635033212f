"""``accel.utils.fsdp_common`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.fsdp_common`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.fsdp_plugin import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)
from accel.fsdp_settings import (
    FSDPSettings as FSDPSettings,
)
from accel.patch_forwarding import serve_as_door
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
