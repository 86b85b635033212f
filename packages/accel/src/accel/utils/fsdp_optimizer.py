"""``accel.utils.fsdp_optimizer`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.fsdp_optimizer`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.constants import (
    OPTIMIZER_NAME as OPTIMIZER_NAME,
)
from accel.fsdp_plugin import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp_common import (
    PathLike as PathLike,
)
from accel.strategies.fsdp_common import (
    resolve_plugin as resolve_plugin,
)
from accel.strategies.fsdp_optimizer import (
    load_fsdp_optimizer,
    save_fsdp_optimizer,
)

__all__ = ["load_fsdp_optimizer", "save_fsdp_optimizer"]

serve_as_door(__name__, "accel.strategies.fsdp_optimizer")
