"""Accelerate's ``fsdp2_*`` helpers and FSDP loading switches, on accel's FSDP strategy.

``fsdp2_prepare_model`` and ``fsdp2_apply_ac`` use the FSDP strategy of the ``Accelerator``
(its plugin's wrap policy and mesh); the others are free-standing.

Example:
    >>> from accel.utils import fsdp2_canonicalize_names
    >>> fsdp2_canonicalize_names({"_orig_mod.layers.0._checkpoint_wrapped_module.w": 1})
    {'layers.0.w': 1}
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel_ckpt.big_modeling.model_helpers import retie_parameters
from accel_ckpt.big_modeling.tensors import find_tied_parameters

RAM_EFFICIENT_LOADING_VARIABLE = "FSDP_CPU_RAM_EFFICIENT_LOADING"


def enable_fsdp_ram_efficient_loading() -> None:
    """Set ``FSDP_CPU_RAM_EFFICIENT_LOADING=True`` (transformers' ``from_pretrained`` reads it).

    With it, transformers materialises the weights on rank 0 only; accel's FSDP strategy then
    starts every rank from rank 0's weights (``sync_module_states``).
    """
    os.environ[RAM_EFFICIENT_LOADING_VARIABLE] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Set ``FSDP_CPU_RAM_EFFICIENT_LOADING=False`` (every rank loads the weights)."""
    os.environ[RAM_EFFICIENT_LOADING_VARIABLE] = "False"


def get_fsdp2_grad_scaler(**kwargs: Any) -> Any:
    """A ``torch.amp.GradScaler`` for this machine's device (FSDP2 needs no sharded scaler)."""
    from accel.amp import get_grad_scaler

    return get_grad_scaler(**kwargs)


def fsdp2_canonicalize_names(named_params: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the ``_checkpoint_wrapped_module`` and ``_orig_mod`` parts that wrappers add to names."""
    cleaned: dict[str, Any] = {}
    for name, value in named_params.items():
        name = name.replace("._checkpoint_wrapped_module", "")
        name = name.removeprefix("_orig_mod.").replace("._orig_mod", "")
        cleaned[name] = value
    return cleaned


def fsdp2_switch_optimizer_parameters(
    optimizer: torch.optim.Optimizer, mapping: Mapping[Any, torch.Tensor]
) -> None:
    """Point ``optimizer``'s parameter groups at new (sharded) parameters, in place.

    Args:
        optimizer: The optimizer built over the original parameters.
        mapping: Original parameter's ``data_ptr()`` (or the bound ``data_ptr`` method, as
            Accelerate keys it) -> the parameter that replaces it.

    Raises:
        KeyError: A parameter of the optimizer has no replacement in ``mapping``.
    """
    for group in optimizer.param_groups:
        switched = []
        for param in group["params"]:
            for key in (param.data_ptr(), param.data_ptr):
                if key in mapping:
                    switched.append(mapping[key])
                    break
            else:
                raise KeyError(
                    f"fsdp2_switch_optimizer_parameters: no replacement for a parameter of shape "
                    f"{tuple(param.shape)} (data_ptr {param.data_ptr()}) in mapping; build the "
                    "mapping from every parameter the optimizer holds."
                )
        group["params"] = switched


def _fsdp_strategy(accelerator: Any, caller: str) -> Any:
    from accel.strategies.fsdp.strategy import FSDPStrategy

    strategy = getattr(accelerator, "strategy", None)
    if not isinstance(strategy, FSDPStrategy):
        raise AcceleratorConfigError(
            f"{caller} needs an Accelerator set up for FSDP (fsdp_plugin=... or accel launch "
            f"--use_fsdp); this one uses {type(strategy).__name__}."
        )
    return strategy


def fsdp2_prepare_model(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` with the Accelerator's FSDP settings (``fully_shard`` for FSDP2).

    Returns:
        The sharded model (the same object under FSDP2).

    Raises:
        AcceleratorConfigError: The Accelerator is not set up for FSDP.
    """
    strategy = _fsdp_strategy(accelerator, "fsdp2_prepare_model")
    wrapped: torch.nn.Module = strategy.wrap(model.to(accelerator.device))
    return wrapped


def fsdp2_apply_ac(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Wrap the layers the plugin's auto-wrap policy picks in activation checkpointing.

    Raises:
        AcceleratorConfigError: No FSDP Accelerator, or the policy picks no layers.
    """
    from accel.strategies.fsdp.strategy import checkpoint_activations

    strategy = _fsdp_strategy(accelerator, "fsdp2_apply_ac")
    checkpoint_activations(model, strategy._layers(model))
    return model


def fsdp2_load_full_state_dict(
    accelerator: Any,
    model: torch.nn.Module,
    full_sd: Mapping[str, torch.Tensor],
    cpu_offload: bool = False,
) -> None:
    """Load a full state dict held by the main process into a sharded model (collective).

    Only rank 0's ``full_sd`` is read; the others may pass ``{}``. Each rank keeps its shards.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, cpu_offload=cpu_offload
    )
    set_model_state_dict(model, dict(full_sd), options=options)
    accelerator.wait_for_everyone()


def ensure_weights_retied(
    param_init_fn: Callable[[torch.nn.Module], Any] | None,
    model: torch.nn.Module,
    device: torch.device | str,
) -> Callable[[torch.nn.Module], Any] | None:
    """``param_init_fn`` that re-ties ``model``'s tied weights after initialising a module.

    FSDP materialises modules one at a time; a weight tied across two modules would end up as
    two tensors. Without tied weights ``param_init_fn`` is returned unchanged.

    Args:
        param_init_fn: Initialises one module (e.g. ``module.to_empty(device=...)``).
        model: The whole model.
        device: The device ``param_init_fn`` materialises on (kept for Accelerate's signature).
    """
    del device
    tied = find_tied_parameters(model)
    if param_init_fn is None or not tied:
        return param_init_fn
    init = param_init_fn

    def init_and_retie(module: torch.nn.Module) -> Any:
        result = init(module)
        retie_parameters(model, tied)
        return result

    return init_and_retie


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
