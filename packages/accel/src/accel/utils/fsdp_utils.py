"""Accelerate's ``accelerate.utils.fsdp_utils`` module path: a door to :mod:`accel.strategies.fsdp_model_io`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp_model_io import (
    FSDP_MODEL_NAME,
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
    get_parameters_from_modules,
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
    select_modules,
)
from accel.strategies.fsdp_model_io import (
    FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin,
)
from accel.strategies.fsdp_model_io import (
    PathLike as PathLike,
)
from accel.strategies.fsdp_model_io import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.strategies.fsdp_model_io import (
    adapter_weights_only as adapter_weights_only,
)
from accel.strategies.fsdp_model_io import (
    resolve_plugin as resolve_plugin,
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

serve_as_door(__name__, "accel.strategies.fsdp_model_io")
