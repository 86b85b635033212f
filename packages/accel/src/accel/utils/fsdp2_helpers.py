"""``accel.utils.fsdp2_helpers`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.fsdp.fsdp2_helpers`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.fsdp.fsdp2_helpers import (
    RAM_EFFICIENT_LOADING_VARIABLE as RAM_EFFICIENT_LOADING_VARIABLE,
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
from accel_ckpt.big_modeling.model_helpers import (
    retie_parameters as retie_parameters,
)
from accel_ckpt.big_modeling.tensors import (
    find_tied_parameters as find_tied_parameters,
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

serve_as_door(__name__, "accel.strategies.fsdp.fsdp2_helpers")
