"""Accelerate's ``accelerate.utils.fsdp_utils`` module path: a door to :mod:`accel.strategies.fsdp.model_io`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.ckpt_adapters import (
    merge_fsdp_weights,
)
from accel.constants import (
    FSDP_MODEL_NAME,
)
from accel.errors import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp.common import (
    PathLike as PathLike,
)
from accel.strategies.fsdp.common import (
    adapter_weights_only as adapter_weights_only,
)
from accel.strategies.fsdp.common import (
    get_parameters_from_modules,
    select_modules,
)
from accel.strategies.fsdp.common import (
    resolve_plugin as resolve_plugin,
)
from accel.strategies.fsdp.fsdp2_helpers import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
)
from accel.strategies.fsdp.model_io import (
    load_fsdp_model,
    save_fsdp_model,
)
from accel.strategies.fsdp.optimizer import (
    load_fsdp_optimizer,
    save_fsdp_optimizer,
)
from accel.strategies.fsdp.plugin import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)

__all__ = [
    "FSDP_MODEL_NAME",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "select_modules",
]

serve_as_door(__name__, "accel.strategies.fsdp.model_io")
