"""Accelerator.load_state reading replicated files once per job (importable by module name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from fsdp_workers import TinyLM, global_batch, lm_loss, plugin

from accel import Accelerator
from accel_ckpt import AccelCkptError, ProjectConfiguration
from accel_state import reset_state

SLACK = 64 * 1024


def rchar() -> int:
    """Bytes this process has passed to read()-like system calls (``/proc/self/io``)."""
    with open("/proc/self/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return getattr(tensor, "to_local", lambda: tensor)().detach().clone()


def _snapshot(model: torch.nn.Module, optimizer: Any) -> list[torch.Tensor]:
    tensors = [_local(p) for p in model.parameters()]
    for state in optimizer.optimizer.state.values() if hasattr(optimizer, "optimizer") else []:
        tensors += [_local(v) for _, v in sorted(state.items()) if isinstance(v, torch.Tensor)]
    return tensors


def _prepared(folder: str, mode: str, seed: int) -> tuple[Accelerator, Any, Any]:
    reset_state(stop_process_group=False)
    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True)
    kwargs: dict[str, Any] = {"project_config": config}
    if mode == "fsdp2_full":
        kwargs["fsdp_plugin"] = plugin(2, state_dict_type="FULL_STATE_DICT")
    accelerator = Accelerator(**kwargs)
    torch.manual_seed(seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def full_state_reads(root: str) -> dict[str, Any]:
    """DDP and FSDP2 FULL_STATE_DICT: save, load twice, compare, count bytes; then a bad file."""
    out: dict[str, Any] = {}
    for mode in ("ddp", "fsdp2_full"):
        folder = f"{root}/{mode}"
        accelerator, model, optimizer = _prepared(folder, mode, seed=0)
        accelerator.backward(lm_loss(model, global_batch(0, 4)))
        optimizer.step()
        optimizer.zero_grad()
        expected = _snapshot(model, optimizer)
        saved = Path(accelerator.save_state())
        accelerator, model, optimizer = _prepared(folder, mode, seed=1)
        accelerator.load_state(saved)  # warm-up: imports and first-use paths
        accelerator, model, optimizer = _prepared(folder, mode, seed=2)
        before = rchar()
        accelerator.load_state(saved)
        out[f"{mode}_read"] = rchar() - before
        got = _snapshot(model, optimizer)
        out[f"{mode}_bitwise"] = len(got) == len(expected) and all(
            g.dtype == e.dtype and torch.equal(g, e) for g, e in zip(got, expected, strict=True)
        )
        out[f"{mode}_sizes"] = {
            str(p.relative_to(saved)): p.stat().st_size for p in saved.rglob("*") if p.is_file()
        }
        out[f"{mode}_folder"] = str(saved)
    # optimizer.pt replaced by bytes of the same size that are no torch.save file, on rank 0's
    # side of a shared folder: every rank must learn of it from rank 0.
    accelerator, model, optimizer = _prepared(f"{root}/fsdp2_full", "fsdp2_full", seed=3)
    damaged = Path(out["fsdp2_full_folder"], "fsdp_model_0", "optimizer.pt")
    if accelerator.is_main_process:
        damaged.write_bytes(b"\0" * damaged.stat().st_size)
    accelerator.wait_for_everyone()
    try:
        accelerator.load_state(out["fsdp2_full_folder"])
        out["damaged"] = None
    except AccelCkptError as error:
        out["damaged"] = (type(error).__name__, str(error))
    out["after"] = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
    out["rank"] = accelerator.process_index
    return out
