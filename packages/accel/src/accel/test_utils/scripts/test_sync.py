"""Checks of gradient synchronisation (``no_sync``, ``accumulate``) on however many processes run this.

Each process feeds the model different data (its rank's slice), so gradients differ between
processes until they are averaged:

* outside :meth:`~accel.Accelerator.no_sync`, a wrapped (DDP) model's gradients are averaged, so
  every process holds the same gradients, equal to the mean of the per-process gradients;
* inside it (several processes), each process keeps its own local gradients;
* with one process, ``no_sync`` changes nothing;
* under :meth:`~accel.Accelerator.accumulate` with ``gradient_accumulation_steps=k``,
  ``sync_gradients`` is true every k-th batch and on the last batch of the dataloader, gradients
  are averaged only then, and the prepared optimizer steps (and zeroes gradients) only then.

Run with ``debug_launcher(test_sync.main)``, ``accel launch test_sync.py`` or ``python test_sync.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.test_utils.training import RegressionModel
from accel.utils import gather, set_seed


def _reset() -> None:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def _grads(model: torch.nn.Module) -> torch.Tensor:
    """The model's gradients as one flat CPU tensor (zeros where a gradient is missing)."""
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).cpu()
        for p in model.parameters()
    ]
    return torch.cat(parts)


def _same_on_all(tensor: torch.Tensor, device: torch.device) -> bool:
    gathered = gather(tensor.to(device)[None]).cpu()
    return all(torch.allclose(row, gathered[0]) for row in gathered)


def _mean_over_processes(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    gathered: torch.Tensor = gather(tensor.to(device)[None])
    return gathered.cpu().mean(dim=0)


def _local_batch(rank: int, size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch that differs between processes (and so do its gradients)."""
    x = torch.linspace(-1.0, 1.0, size) + rank
    return x, 2 * x + 3 + 0.5 * (rank + 1)


def _backward(model: Any, x: torch.Tensor, y: torch.Tensor, accelerator: Accelerator) -> None:
    loss = torch.nn.functional.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device))
    accelerator.backward(loss)


def check_no_sync() -> None:
    """Averaged gradients outside ``no_sync``, local gradients inside it (when there are several)."""
    _reset()
    accelerator = Accelerator()
    state = PartialState()
    set_seed(0)
    reference = RegressionModel(a=1.0, b=-1.0).to(accelerator.device)
    model = accelerator.prepare(copy.deepcopy(reference))
    x, y = _local_batch(state.process_index)

    with accelerator.no_sync(model):
        _backward(model, x, y, accelerator)
    _backward(reference, x, y, accelerator)
    local, ours = _grads(reference), _grads(model)
    if not torch.allclose(ours, local):
        raise AssertionError(
            f"under no_sync the gradients must stay local: got {ours.tolist()}, expected "
            f"{local.tolist()} (this process's own gradients)"
        )
    if state.num_processes > 1 and _same_on_all(ours, accelerator.device):
        raise AssertionError(
            "under no_sync the gradients were synchronised across processes although each "
            "process saw different data"
        )

    for param in list(model.parameters()) + list(reference.parameters()):
        param.grad = None
    _backward(model, x, y, accelerator)
    _backward(reference, x, y, accelerator)
    synced = _grads(model)
    expected = _mean_over_processes(_grads(reference), accelerator.device)
    if not torch.allclose(synced, expected, atol=1e-6):
        raise AssertionError(
            f"outside no_sync the gradients must be the mean over processes: got "
            f"{synced.tolist()}, expected {expected.tolist()}"
        )
    if not _same_on_all(synced, accelerator.device):
        raise AssertionError("outside no_sync the processes hold different gradients")


def check_accumulate(num_batches: int, steps: int) -> None:
    """``sync_gradients`` every ``steps`` batches and at the end; the optimizer steps only then."""
    _reset()
    accelerator = Accelerator(gradient_accumulation_steps=steps)
    state = PartialState()
    per_process = 2
    total = num_batches * per_process * state.num_processes
    xs = torch.linspace(-2.0, 2.0, total)
    loader = DataLoader(TensorDataset(xs, 2 * xs + 3), batch_size=per_process, shuffle=False)
    set_seed(0)
    model = RegressionModel(a=0.5, b=0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if len(loader) != num_batches:
        raise AssertionError(
            f"prepared dataloader has {len(loader)} batches, expected {num_batches}"
        )

    for index, (x, y) in enumerate(loader):
        before = [p.detach().clone() for p in model.parameters()]
        with accelerator.accumulate(model):
            expected_sync = (index + 1) % steps == 0 or index == num_batches - 1
            if accelerator.sync_gradients != expected_sync:
                raise AssertionError(
                    f"batch {index} of {num_batches} with gradient_accumulation_steps={steps}: "
                    f"sync_gradients={accelerator.sync_gradients}, expected {expected_sync}"
                )
            last = accelerator.gradient_state.end_of_dataloader
            if last != (index == num_batches - 1):
                raise AssertionError(
                    f"batch {index} of {num_batches}: end_of_dataloader={last}, expected "
                    f"{index == num_batches - 1}"
                )
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            grads = _grads(model)
            if state.num_processes > 1:
                same = _same_on_all(grads, accelerator.device)
                if same != expected_sync:
                    raise AssertionError(
                        f"batch {index}: gradients {'are' if same else 'are not'} equal across "
                        f"processes although sync_gradients={expected_sync}"
                    )
            optimizer.step()
            optimizer.zero_grad()
        moved = any(
            not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(), strict=True)
        )
        if moved != expected_sync:
            raise AssertionError(
                f"batch {index}: the optimizer {'stepped' if moved else 'did not step'} although "
                f"sync_gradients={expected_sync} (it steps only on synchronising batches)"
            )
        kept = any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())
        if kept == expected_sync:
            raise AssertionError(
                f"batch {index}: gradients {'kept' if kept else 'zeroed'} after zero_grad although "
                f"sync_gradients={expected_sync} (they accumulate until the synchronising batch)"
            )


def main() -> None:
    """Run every check on this process (collective ones on every process of the job)."""
    state = PartialState()
    state.print("test_sync: no_sync")
    check_no_sync()
    state.print("test_sync: accumulate, 4 batches, 2 steps")
    check_accumulate(num_batches=4, steps=2)
    state.print("test_sync: accumulate, 3 batches, 2 steps (the last batch synchronises)")
    check_accumulate(num_batches=3, steps=2)
    state.print("test_sync: accumulate, 3 batches, 1 step")
    check_accumulate(num_batches=3, steps=1)
    _reset()
    state.wait_for_everyone()
    state.print("test_sync: all checks passed")


if __name__ == "__main__":
    main()
