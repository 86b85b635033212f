"""A 2-process job for what transformers' Trainer asks of accel's FSDP (no transformers here).

The plugin made from the launcher's settings, Accelerate's plugin methods after ``prepare``,
auto-wrap policy functions (PEFT's kind), a regex for ``ignored_modules``, and
``save_fsdp_model(adapter_only=True)`` on plain and partly frozen models.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any

import torch
from fsdp_workers import Block, fresh, global_batch, lm_loss, make_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from accel import FullyShardedDataParallelPlugin
from accel.state import AcceleratorState
from accel.utils import load_fsdp_model, save_fsdp_model

FULL = StateDictOptions(full_state_dict=True)
LAUNCHER = {
    "fsdp_version": 2,
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_transformer_layer_cls_to_wrap": "Block",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
}


def _launched_plugin() -> dict[str, Any]:
    """An Accelerator in a job launched with FSDP: its state holds the launcher's plugin."""
    saved = {name: os.environ.get(name) for name in ("ACCEL_USE_FSDP", "ACCEL_FSDP_CONFIG")}
    os.environ["ACCEL_USE_FSDP"] = "true"
    os.environ["ACCEL_FSDP_CONFIG"] = json.dumps(LAUNCHER)
    try:
        accelerator = fresh()
        plugin = AcceleratorState().fsdp_plugin
        model = accelerator.prepare(make_model())
        from torch.distributed.fsdp import FSDPModule

        return {
            "type": type(plugin).__name__,
            "same_object": plugin is accelerator.state.fsdp_plugin,
            "fsdp_version": plugin.fsdp_version,
            "state_dict_type": plugin.state_dict_type,
            "layers": plugin.transformer_cls_names_to_wrap,
            "reshard_after_forward": plugin.reshard_after_forward,
            "activation_checkpointing": plugin.activation_checkpointing,
            "distributed_type": str(accelerator.distributed_type),
            "sharded": isinstance(model, FSDPModule),
        }
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        fresh()  # leave no FSDP state to the next job in this process


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in get_model_state_dict(model, options=FULL).items()}


def _units(model: torch.nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return sorted(
        type(module).__name__
        for name, module in model.named_modules()
        if name and isinstance(module, (FSDPModule, FSDP))
    )


def _policy_functions() -> dict[str, Any]:
    """torch's policy functions (as PEFT's fsdp_auto_wrap_policy returns) choose the units."""
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy, transformer_auto_wrap_policy

    out: dict[str, Any] = {}
    by_class = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    for version in (1, 2):
        accelerator = fresh(
            fsdp_plugin=FullyShardedDataParallelPlugin(
                fsdp_version=version, auto_wrap_policy=by_class
            )
        )
        model = accelerator.prepare(make_model())
        out[f"transformer_fsdp{version}"] = _units(model)
    heads = functools.partial(
        lambda_auto_wrap_policy, lambda_fn=lambda module: module.__class__ is torch.nn.Linear
    )
    accelerator = fresh(
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy=heads)
    )
    out["lambda_fsdp2"] = _units(accelerator.prepare(make_model()))
    return out


def _ignored_by_regex() -> dict[str, Any]:
    """``ignored_modules`` as a regex: the named modules keep whole, unsharded parameters."""
    from torch.distributed.tensor import DTensor

    out: dict[str, Any] = {}
    for version in (1, 2):
        accelerator = fresh(
            fsdp_plugin=FullyShardedDataParallelPlugin(
                fsdp_version=version,
                auto_wrap_policy="transformer_based_wrap",
                transformer_cls_names_to_wrap=["Block"],
                ignored_modules=r"head",
            )
        )
        model = accelerator.prepare(make_model())
        inner = getattr(model, "module", model)
        out[f"fsdp{version}"] = {
            "head_whole": not isinstance(inner.head.weight, DTensor)
            and tuple(inner.head.weight.shape) == tuple(make_model().head.weight.shape),
            "loss_finite": bool(torch.isfinite(lm_loss(model, global_batch(0, 4))).item()),
        }
    return out


def _step(accelerator: Any, model: Any, optimizer: Any, step: int) -> None:
    accelerator.backward(lm_loss(model, global_batch(step, 4)))
    optimizer.step()
    optimizer.zero_grad()


def _adapter_only(folder: str) -> dict[str, Any]:
    """``adapter_only=True``: ignored for a plain model (as in Accelerate); frozen weights stay.

    A partly frozen model stands in for a PEFT one here (peft is not installed for these
    tests): its trainable-only state is written and read by FSDPModelState(trainable_only=True).
    """
    from accel.strategies.fsdp.checkpoint import FSDPModelState

    out: dict[str, Any] = {}
    for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Block"],
            state_dict_type=kind,
        )
        accelerator = fresh(fsdp_plugin=plugin)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = accelerator.prepare(model, optimizer)
        _step(accelerator, model, optimizer, 0)
        saved = _full(model)
        target = save_fsdp_model(plugin, accelerator, model, f"{folder}/{kind}", adapter_only=True)
        _step(accelerator, model, optimizer, 1)
        load_fsdp_model(plugin, accelerator, model, f"{folder}/{kind}", adapter_only=True)
        loaded = _full(model)
        out[kind] = {
            "name": os.path.basename(target),
            "restored": saved.keys() == loaded.keys()
            and all(torch.equal(saved[k], loaded[k]) for k in saved),
        }

    accelerator = fresh(
        fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=["Block"],
        )
    )
    model = make_model()
    for parameter in model.embed.parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer, 0)
    state = FSDPModelState("adapters", model, [], trainable_only=True)
    path = pathlib.Path(folder) / "trainable"
    state.save(path)
    saved = _full(model)
    _step(accelerator, model, optimizer, 1)
    with torch.no_grad():
        for parameter in model.embed.parameters():
            parameter.add_(1.0)  # a frozen weight changed: loading must not touch it
    frozen_now = _full(model)["embed.weight"]
    state.load(path)
    loaded = _full(model)
    from torch.distributed.checkpoint import FileSystemReader

    keys = sorted(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    out["trainable_only"] = {
        "embed_saved": any("embed" in key for key in keys),
        "head_saved": any(key.endswith("head.weight") for key in keys),
        "trainable_restored": all(
            torch.equal(saved[k], loaded[k]) for k in saved if not k.startswith("embed.")
        ),
        "frozen_untouched": torch.equal(loaded["embed.weight"], frozen_now),
    }
    return out


def _switched_state_dict_type(folder: str) -> dict[str, Any]:
    """set_state_dict_type after prepare reaches save_state (Accelerate reads it at save time)."""
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type="SHARDED_STATE_DICT",
    )
    accelerator = fresh(fsdp_plugin=plugin)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer, 0)
    plugin.set_state_dict_type("FULL_STATE_DICT")
    accelerator.save_state(folder)
    files = sorted(
        os.path.relpath(os.path.join(root, name), folder)
        for root, _, names in os.walk(folder)
        for name in names
        if "fsdp_model" in root
    )
    return {"files": files, "plugin_type": plugin.state_dict_type}


def trainer_surface_job(folder: str) -> dict[str, Any]:
    """Everything above on each rank (the folder is shared)."""
    return {
        "launched": _launched_plugin(),
        "policies": _policy_functions(),
        "ignored": _ignored_by_regex(),
        "adapter_only": _adapter_only(os.path.join(folder, "adapter")),
        "switched": _switched_state_dict_type(os.path.join(folder, "switched")),
    }
