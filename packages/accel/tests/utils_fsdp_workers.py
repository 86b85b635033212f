"""One 2-process FSDP2 job checking the accel.utils FSDP helpers on a real sharded model."""

from __future__ import annotations

import os
from typing import Any

import torch
from fsdp_workers import SEQ, fresh, global_batch, make_model
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from accel import FullyShardedDataParallelPlugin
from accel.utils import (
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    load_fsdp_model,
    load_fsdp_optimizer,
    model_has_dtensor,
    save_fsdp_model,
    save_fsdp_optimizer,
)

FULL = StateDictOptions(full_state_dict=True)


def _plugin(state_dict_type: str) -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        state_dict_type=state_dict_type,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
    )


def _step(accelerator: Any, model: Any, optimizer: Any, step: int) -> None:
    tokens = global_batch(step, 4)[:, : SEQ + 1]
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def _full(model: Any, optimizer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    weights = {k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()}
    optim = get_optimizer_state_dict(model, optimizer.optimizer, options=FULL)
    states = {
        f"{k}.{n}": t.clone()
        for k, per in optim["state"].items()
        for n, t in per.items()
        if isinstance(t, torch.Tensor)
    }
    return weights, states


def _same(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def _round_trip(folder: str, state_dict_type: str) -> dict[str, Any]:
    """Train, save weights and optimizer, train on, load: the saved state comes back exactly."""
    plugin = _plugin(state_dict_type)
    accelerator = fresh(fsdp_plugin=plugin)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer, 0)
    saved_weights, saved_optim = _full(model, optimizer)
    model_path = save_fsdp_model(plugin, accelerator, model, folder)
    optim_path = save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
    _step(accelerator, model, optimizer, 1)
    moved_weights, moved_optim = _full(model, optimizer)
    load_fsdp_model(plugin, accelerator, model, folder)
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
    loaded_weights, loaded_optim = _full(model, optimizer)
    return {
        "model_path": os.path.basename(model_path),
        "optim_path": os.path.basename(optim_path),
        "files": sorted(os.listdir(folder)),
        "moved": not _same(saved_weights, moved_weights) and not _same(saved_optim, moved_optim),
        "weights_restored": _same(saved_weights, loaded_weights),
        "optimizer_restored": _same(saved_optim, loaded_optim) and len(saved_optim) > 0,
    }


def _fsdp2_helpers() -> dict[str, Any]:
    """fsdp2_prepare_model, fsdp2_switch_optimizer_parameters, fsdp2_load_full_state_dict, AC."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    accelerator = fresh(fsdp_plugin=_plugin("SHARDED_STATE_DICT"))
    model = make_model()
    reference = {k: v.clone() for k, v in make_model().state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # differs from the reference until the full state is loaded
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    sharded = fsdp2_prepare_model(accelerator, model)
    mapping = {pointers[name]: p for name, p in sharded.named_parameters()}
    fsdp2_switch_optimizer_parameters(optimizer, mapping)
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    full_sd = reference if accelerator.is_main_process else {}
    fsdp2_load_full_state_dict(accelerator, sharded, full_sd)
    loaded = get_model_state_dict(sharded, options=FULL)

    checkpointed = fresh(
        fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Block"],
        )
    )
    plain = make_model()
    fsdp2_apply_ac(checkpointed, plain)
    names = dict(plain.named_parameters())
    return {
        "is_fsdp_module": isinstance(sharded, FSDPModule),
        "has_dtensor": model_has_dtensor(sharded) and not model_has_dtensor(plain),
        "optimizer_holds_shards": len(in_optimizer) == len(mapping)
        and all(isinstance(p, DTensor) for p in in_optimizer)
        and {id(p) for p in in_optimizer} == {id(p) for p in sharded.parameters()},
        "full_state_loaded": _same({k: v for k, v in loaded.items()}, reference),
        "ac_wrapped": any("_checkpoint_wrapped_module" in name for name in names),
        "canonical_names": sorted(fsdp2_canonicalize_names(names))
        == sorted(dict(make_model().named_parameters())),
    }


def fsdp_utils_job(folder: str) -> dict[str, Any]:
    """Everything above, on each rank (the folders are shared)."""
    return {
        "sharded": _round_trip(os.path.join(folder, "sharded"), "SHARDED_STATE_DICT"),
        "full": _round_trip(os.path.join(folder, "full"), "FULL_STATE_DICT"),
        "fsdp2": _fsdp2_helpers(),
    }
