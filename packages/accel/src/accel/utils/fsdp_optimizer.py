"""``accel.utils.fsdp_optimizer`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.fsdp.optimizer`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.constants import (
    OPTIMIZER_NAME as OPTIMIZER_NAME,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp.common import (
    PathLike as PathLike,
)
from accel.strategies.fsdp.common import (
    resolve_plugin as resolve_plugin,
)
from accel.strategies.fsdp.optimizer import (
    load_fsdp_optimizer,
    save_fsdp_optimizer,
)
from accel.strategies.fsdp.plugin import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)

__all__ = ["load_fsdp_optimizer", "save_fsdp_optimizer"]

serve_as_door(__name__, "accel.strategies.fsdp.optimizer")
