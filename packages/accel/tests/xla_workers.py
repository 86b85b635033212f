"""The XLA training loop, run in-process by test_xla.py and by every replica on a TPU VM."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader
from workers import IndexedRegression, make_model

from accel import Accelerator

#: 28 samples in batches of 4: 7 batches, so with accumulation 2 the epoch ends on a micro-step.
SAMPLES, BATCH, ACCUMULATION, EPOCHS, CLIP = 28, 4, 2, 4, 2.0


def marks() -> int:
    """torch_xla's count of graph cuts (``torch_xla.sync`` / ``mark_step``) so far."""
    import torch_xla.debug.metrics as metrics

    return metrics.counter_value("MarkStep") or 0


def compiles() -> int:
    """Graphs torch_xla compiled (not found in its cache) so far."""
    import torch_xla.debug.metrics as metrics

    return metrics.counter_value("UncachedCompile") or 0


def train(cpu: bool = False, clip: float = CLIP) -> dict:
    """Train with accumulation and clipping; record what each micro-step did."""
    accelerator = Accelerator(cpu=cpu, gradient_accumulation_steps=ACCUMULATION)
    on_xla = accelerator.device.type == "xla"
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # built before prepare
    loader = DataLoader(IndexedRegression(SAMPLES), batch_size=BATCH, shuffle=True)
    evaluation = DataLoader(IndexedRegression(10), batch_size=4)
    model, optimizer, loader, evaluation = accelerator.prepare(model, optimizer, loader, evaluation)
    record: dict = {
        "loader": type(loader).__name__,
        "device": accelerator.device.type,
        "optimizer_steps_model": all(
            a is b
            for a, b in zip(optimizer.param_groups[0]["params"], model.parameters(), strict=True)
        ),
        "epoch_loss": [],
        "sync": [],
        "cuts_in_step": [],
        "norms": [],
        "compiles": [],
    }
    for _ in range(EPOCHS):
        losses = []
        for x, y, _index in loader:
            assert x.device.type == accelerator.device.type
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
                accelerator.backward(loss)
                # As in Accelerate, every call clips and returns the norm, micro-steps included.
                norm = accelerator.clip_grad_norm_(model.parameters(), clip)
                grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                record["norms"].append((norm.item(), grads.norm().item()))
                before = marks() if on_xla else 0
                optimizer.step()
                record["cuts_in_step"].append((marks() - before) if on_xla else None)
                optimizer.zero_grad()
            record["sync"].append(accelerator.sync_gradients)
            losses.append(loss.detach())
        record["epoch_loss"].append(torch.stack(losses).mean().item())
        record["compiles"].append(compiles() if on_xla else None)
    gathered, names = [], []
    for _x, _y, index in evaluation:
        gathered.append(accelerator.gather_for_metrics(index))
        names.extend(accelerator.gather_for_metrics([f"s{i}" for i in index.tolist()]))
    record["evaluated"] = torch.cat(gathered).cpu().tolist()
    record["evaluated_objects"] = names
    record["eval_device"] = gathered[0].device.type
    record["weights"] = [p.detach().cpu().reshape(-1).tolist() for p in model.parameters()]
    record["num_processes"] = accelerator.num_processes
    record["process_index"] = accelerator.process_index
    return record
