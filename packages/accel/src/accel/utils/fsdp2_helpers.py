"""Accelerate's ``accelerate.utils.fsdp2_helpers`` module path: a door to :mod:`accel.strategies.fsdp2_helpers`."""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp2_helpers import (
    RAM_EFFICIENT_LOADING_VARIABLE as RAM_EFFICIENT_LOADING_VARIABLE,
)
from accel.strategies.fsdp2_helpers import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.strategies.fsdp2_helpers import (
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
from accel.strategies.fsdp2_helpers import (
    find_tied_parameters as find_tied_parameters,
)
from accel.strategies.fsdp2_helpers import (
    retie_parameters as retie_parameters,
)

__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
]

serve_as_door(__name__, "accel.strategies.fsdp2_helpers")
