"""``accel.utils.fsdp_common`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.fsdp.common`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp.common import (
    PathLike,
    adapter_weights_only,
    get_parameters_from_modules,
    resolve_plugin,
    select_modules,
)
from accel.strategies.fsdp.plugin import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)
from accel.strategies.fsdp.settings import (
    FSDPSettings as FSDPSettings,
)

__all__ = [
    "PathLike",
    "adapter_weights_only",
    "get_parameters_from_modules",
    "resolve_plugin",
    "select_modules",
]

serve_as_door(__name__, "accel.strategies.fsdp.common")
