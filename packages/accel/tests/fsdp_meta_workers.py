"""Worker functions: FSDP started from rank 0's weights while rank 1 built its model on ``meta``.

Each run is compared with the same job where every rank built the full model (a plain load):
the shards right after ``prepare`` and the training that follows must be the same bits.
"""

from __future__ import annotations

from typing import Any

import torch
from fsdp_workers import DIM, SEQ, VOCAB, TinyLM, fresh, global_batch, lm_loss

from accel import AcceleratorConfigError, FullyShardedDataParallelPlugin

STEPS, SIZE = 3, 8


class TiedLM(TinyLM):
    """TinyLM with the head tied to the embedding and a non-persistent buffer (as rotary's)."""

    def __init__(self) -> None:
        super().__init__()
        self.head.weight = self.embed.weight
        positions = torch.arange(SEQ, dtype=torch.float32)
        self.register_buffer("position_scale", 1.0 + positions / SEQ, persistent=False)
        self.register_buffer("mean_shift", torch.full((DIM,), 0.01))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * self.position_scale[: tokens.shape[1], None] + self.mean_shift
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(on_meta: bool) -> TiedLM:
    """The model with rank 0's seed, or the same structure on ``meta`` (no weights)."""
    if on_meta:
        with torch.device("meta"):
            return TiedLM()
    torch.manual_seed(0)
    return TiedLM()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if to_local is not None else tensor).detach().cpu().clone()


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shards (parameters) and buffers, by name."""
    state = {f"param:{name}": _local(p) for name, p in model.named_parameters()}
    state.update({f"buffer:{name}": _local(b) for name, b in model.named_buffers()})
    return state


def _run(version: int, meta_on_rank1: bool, **settings: Any) -> dict[str, Any]:
    """Prepare (rank 1's model on meta or not), snapshot, train ``STEPS`` steps, snapshot."""
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        **settings,
    )
    accelerator = fresh(fsdp_plugin=plugin)
    rank = accelerator.process_index
    model = build(on_meta=meta_on_rank1 and rank == 1)
    built_on_meta = all(p.is_meta for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before prepare
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)
    prepared = _snapshot(model)
    share = SIZE // accelerator.num_processes
    losses = []
    for step in range(STEPS):
        tokens = global_batch(step, SIZE)[rank * share : (rank + 1) * share]
        loss = lm_loss(model, tokens.to(accelerator.device))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    return {
        "built_on_meta": built_on_meta,
        "prepared": prepared,
        "trained": _snapshot(model),
        "losses": losses,
        "tied": inner.head.weight is inner.embed.weight,
        "meta_left": [
            n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta
        ],
        "position_scale": _local(inner.position_scale),
    }


def _error(version: int, meta_rank: int, **settings: Any) -> str:
    """The message ``prepare`` raises when rank ``meta_rank`` built its model on meta."""
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, **settings)
    accelerator = fresh(fsdp_plugin=plugin)
    model = build(on_meta=accelerator.process_index == meta_rank)
    try:
        accelerator.prepare(model)
    except AcceleratorConfigError as error:
        return str(error)
    return "no error"


def meta_job() -> dict[str, Any]:
    """Every run of the test module, in one 2-process job."""
    results: dict[str, Any] = {}
    for version in (2, 1):
        results[f"fsdp{version}_plain"] = _run(version, meta_on_rank1=False)
        results[f"fsdp{version}_meta"] = _run(
            version, meta_on_rank1=True, cpu_ram_efficient_loading=True
        )
    # FSDP2 with sync_module_states alone (no cpu_ram_efficient_loading) takes meta models too.
    results["fsdp2_sync_meta"] = _run(2, meta_on_rank1=True)
    results["rank0_meta"] = _error(2, meta_rank=0, cpu_ram_efficient_loading=True)
    results["rank0_meta_fsdp1"] = _error(1, meta_rank=0, cpu_ram_efficient_loading=True)
    results["no_sync"] = _error(
        2, meta_rank=1, sync_module_states=False, cpu_ram_efficient_loading=False
    )
    try:
        FullyShardedDataParallelPlugin(
            cpu_ram_efficient_loading=True, sync_module_states=False
        ).resolved()
        results["config"] = "no error"
    except AcceleratorConfigError as error:
        results["config"] = str(error)
    return results


__all__ = ["VOCAB", "TiedLM", "build", "meta_job"]
