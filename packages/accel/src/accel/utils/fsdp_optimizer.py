"""Accelerate's ``accelerate.utils.fsdp_optimizer`` module path: a door to :mod:`accel.strategies.fsdp_optimizer`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp_optimizer import (
    OPTIMIZER_NAME as OPTIMIZER_NAME,
)
from accel.strategies.fsdp_optimizer import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)
from accel.strategies.fsdp_optimizer import (
    PathLike as PathLike,
)
from accel.strategies.fsdp_optimizer import (
    load_fsdp_optimizer,
    save_fsdp_optimizer,
)
from accel.strategies.fsdp_optimizer import (
    resolve_plugin as resolve_plugin,
)

__all__ = [
    "load_fsdp_optimizer",
    "save_fsdp_optimizer",
]

serve_as_door(__name__, "accel.strategies.fsdp_optimizer")
