"""Start FSDP from rank 0's weights when the other ranks built the model on the ``meta`` device.

With ``cpu_ram_efficient_loading`` only local rank 0 reads the full weights into host memory;
the other ranks build the model on ``meta`` (no storage). At ``prepare`` the strategy asks every
rank where its tensors are (:func:`meta_ranks`), refuses a job that cannot be started
(:func:`check_meta_ranks`), then:

- FSDP2: :func:`detach_full_state` keeps rank 0's full state dict and non-persistent buffers and
  moves the model to ``meta`` on every rank; after ``fully_shard``, :func:`load_full_state`
  fills each rank's shards from rank 0 by broadcast (torch's ``set_model_state_dict`` with
  ``broadcast_from_rank0``) and broadcasts the non-persistent buffers.
- FSDP1: :func:`materialize_fn` gives FSDP1's ``param_init_fn`` (``to_empty`` on the device,
  re-tying shared weights); FSDP1's own ``sync_module_states`` then broadcasts rank 0's values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from accel.errors import AcceleratorConfigError
from accel_ckpt.big_modeling.tensors import find_tied_parameters

_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def has_meta_tensors(model: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the ``meta`` device."""
    return any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()])


def meta_ranks(model: torch.nn.Module, device: torch.device) -> list[int]:
    """The ranks whose copy of ``model`` holds ``meta`` tensors (collective: every rank calls it).

    Args:
        model: This rank's model, before sharding.
        device: A tensor device the process group's backend can reduce on.
    """
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int32, device=device)
    flags[dist.get_rank()] = int(has_meta_tensors(model))
    dist.all_reduce(flags)
    return [rank for rank, flag in enumerate(flags.tolist()) if flag]


def check_meta_ranks(ranks: list[int], sync_module_states: bool, has_param_init_fn: bool) -> None:
    """Refuse a model that no rank could fill: the same error on every rank.

    Args:
        ranks: The ranks with ``meta`` tensors (:func:`meta_ranks`).
        sync_module_states: Whether the other ranks start from rank 0's weights.
        has_param_init_fn: Whether the plugin has a ``param_init_fn`` that gives meta modules
            their values (then meta tensors anywhere are the user's design).

    Raises:
        AcceleratorConfigError: Rank 0 has meta tensors and no ``param_init_fn``, or other ranks
            have them while ``sync_module_states`` is off.
    """
    if not ranks or has_param_init_fn:
        return
    if 0 in ranks:
        raise AcceleratorConfigError(
            "cpu_ram_efficient_loading / sync_module_states: rank 0's model has parameters or "
            "buffers on the meta device, but rank 0 is where every rank's weights come from. "
            "Load the real weights on rank 0 (from_pretrained there without a meta/empty-weight "
            "context), or give FullyShardedDataParallelPlugin(param_init_fn=...) to initialise "
            "them."
        )
    if not sync_module_states:
        raise AcceleratorConfigError(
            f"sync_module_states=False, but ranks {ranks} hold their model on the meta device "
            "(as cpu_ram_efficient_loading leaves it): nothing would fill their weights. Set "
            "sync_module_states=True (fsdp_sync_module_states: true), or load real weights on "
            "every rank (cpu_ram_efficient_loading=False)."
        )


def tie(model: torch.nn.Module, groups: list[list[str]]) -> None:
    """Make each group of parameter names share the first name's parameter (meta ones too)."""
    for group in groups:
        shared = model.get_parameter(group[0])
        for name in group[1:]:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, shared)


def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclasses.dataclass
class FullState:
    """What :func:`detach_full_state` kept to fill the sharded model.

    Attributes:
        state_dict: Rank 0's full state dict by clean name (empty on the other ranks).
        buffers: Each non-persistent buffer as (module, name, rank 0's value or this rank's
            placeholder), in module order (the same on every rank).
        tied: Groups of parameter names that share one tensor.
    """

    state_dict: dict[str, Any]
    buffers: list[tuple[torch.nn.Module, str, torch.Tensor]]
    tied: list[list[str]]


def detach_full_state(model: torch.nn.Module, rank: int) -> FullState:
    """Keep rank 0's weights aside and move ``model`` to ``meta`` on every rank, ties kept.

    Sharding then happens on ``meta`` (no second full copy on any device); rank 0's full tensors
    live only in the returned state until :func:`load_full_state` has broadcast them.
    """
    tied = find_tied_parameters(model)
    state = {_clean(name): value for name, value in model.state_dict().items()} if rank == 0 else {}
    buffers = [
        (module, name, buffer)
        for module in model.modules()
        for name, buffer in module._buffers.items()
        if buffer is not None and name in module._non_persistent_buffers_set
    ]
    model.to(torch.device("meta"))
    tie(model, tied)
    return FullState(state_dict=state, buffers=buffers, tied=tied)


def load_full_state(
    model: torch.nn.Module, full: FullState, device: torch.device, cpu_offload: bool
) -> None:
    """Fill the sharded ``model`` from rank 0's :class:`FullState` (collective).

    Parameters and persistent buffers go through torch's ``set_model_state_dict`` with
    ``broadcast_from_rank0`` (each rank keeps its shards); non-persistent buffers, which no
    state dict holds, are broadcast one by one.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # Storage for this rank's shards where they live (the CPU under CPU offload), so the
    # broadcast lands there and copies into them (torch would guess the device from the group).
    model.to_empty(device=torch.device("cpu") if cpu_offload else device)
    tie(model, full.tied)
    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, cpu_offload=cpu_offload
    )
    set_model_state_dict(model, full.state_dict, options=options)
    full.state_dict.clear()
    rank = dist.get_rank()
    with torch.no_grad():
        for module, name, kept in full.buffers:
            if rank == 0:
                value = kept.detach().to(device).clone()
            else:
                value = torch.empty(kept.shape, dtype=kept.dtype, device=device)
            dist.broadcast(value, src=0)
            module._buffers[name] = value
    full.buffers.clear()


def materialize_fn(
    model: torch.nn.Module, device: torch.device
) -> Callable[[torch.nn.Module], Any]:
    """FSDP1's ``param_init_fn`` for meta modules: storage on ``device``, shared weights re-tied.

    The values are then rank 0's, through FSDP1's ``sync_module_states``.
    """
    tied = find_tied_parameters(model)

    def materialize(module: torch.nn.Module) -> None:
        module.to_empty(device=device, recurse=False)
        materialized = {id(tensor) for tensor in module.parameters(recurse=False)}
        for group in tied:
            # The group's materialized parameter becomes every name's (the others are meta).
            for name in group:
                if id(model.get_parameter(name)) in materialized:
                    tie(model, [[name, *(other for other in group if other != name)]])
                    break

    return materialize


__all__ = [
    "FullState",
    "check_meta_ranks",
    "detach_full_state",
    "has_meta_tensors",
    "load_full_state",
    "materialize_fn",
    "meta_ranks",
    "tie",
]
