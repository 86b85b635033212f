"""Accelerate's five DeepSpeed config templates, unchanged, each training a model under accel.

Run by ``deepspeed_script.py --templates DIR`` (under ``accel launch``, 2 CPU/gloo processes):
one named plugin per template file; for each in turn the Accelerator prepares a model with a
``config.hidden_size``, ``DummyOptim``, ``DummyScheduler`` and a dataloader, as Accelerate's
``deepspeed_with_config_support.py`` does, trains ``STEPS`` optimizer steps and frees its engine.
Writes per template the resolved config, the losses, the learning rates, the engine's facts,
or the error it stopped on, as JSON to ``out`` (rank 0).
"""

from __future__ import annotations

import json
import traceback
import types
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DeepSpeedPlugin
from accel.utils import DummyOptim, DummyScheduler

BATCH, ACCUMULATION, STEPS, LR, HIDDEN = 4, 2, 6, 0.02, 16
#: Optimizer steps over the whole dataset, as a script counts them before ``prepare``.
TOTAL_STEPS, WARMUP_STEPS = 16, 2


class HiddenSizeMLP(torch.nn.Module):
    """A small MLP carrying a Transformers-style ``config.hidden_size``."""

    def __init__(self) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(hidden_size=HIDDEN)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)


def train_one(accelerator: Accelerator) -> dict[str, Any]:
    """Train a fresh model under the selected plugin; facts about the run."""
    torch.manual_seed(0)
    model = HiddenSizeMLP()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=generator)
    y = (x[:, :1] * 3 - x[:, 1:2]).tanh() + 0.1 * torch.randn(256, 1, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)
    optimizer = DummyOptim(model.parameters(), lr=LR, weight_decay=0.01)
    scheduler = DummyScheduler(
        optimizer, total_num_steps=TOTAL_STEPS, warmup_num_steps=WARMUP_STEPS
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses: list[float] = []
    lrs: list[float] = []
    total = 0.0
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        total += float(accelerator.reduce(loss.detach(), reduction="mean")) / ACCUMULATION
        if accelerator.sync_gradients:
            losses.append(total)
            lrs.append(float(model.get_lr()[0]))
            total = 0.0
            if len(losses) == STEPS:
                break
    engine_scheduler = model.lr_scheduler
    facts = {
        "losses": losses,
        "lrs": lrs,
        "config": accelerator.state.deepspeed_plugin.deepspeed_config,
        "engine": {
            "optimizer": type(model.optimizer).__name__,
            "basic_optimizer": type(getattr(model, "basic_optimizer", None)).__name__,
            "scheduler": type(engine_scheduler).__name__,
            "total_num_steps": getattr(engine_scheduler, "total_num_steps", None),
            "warmup_num_steps": getattr(engine_scheduler, "warmup_num_steps", None),
            "clipping": model.gradient_clipping(),
            "stage": model.zero_optimization_stage(),
            "cpu_offload": bool(model.zero_cpu_offload()),
            "train_batch": model.train_batch_size(),
            "fp16": model.fp16_enabled(),
            "bf16": model.bfloat16_enabled(),
        },
    }
    accelerator.free_memory()
    return facts


def run_templates(folder: str, out: str) -> None:
    """Train under each ``*.json`` template of ``folder``; the report goes to ``out``.

    One Accelerator holds one plugin per template; ``free_memory`` after each run destroys
    its engine, so the next selected plugin builds the next one.
    """
    names = sorted(path.stem for path in Path(folder).glob("*.json"))
    plugins = {
        name: DeepSpeedPlugin(hf_ds_config=str(Path(folder) / f"{name}.json")) for name in names
    }
    accelerator = Accelerator(deepspeed_plugins=plugins, gradient_accumulation_steps=ACCUMULATION)
    report: dict[str, Any] = {"num_processes": accelerator.num_processes, "templates": {}}
    for name in names:
        accelerator.state.select_deepspeed_plugin(name)
        try:
            report["templates"][name] = train_one(accelerator)
        except Exception as error:  # noqa: BLE001 - reported per template, the others still run
            report["templates"][name] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-4000:],
            }
            accelerator.free_memory()
    if accelerator.is_main_process:
        with open(out, "w") as handle:
            json.dump(report, handle)
    accelerator.end_training()
