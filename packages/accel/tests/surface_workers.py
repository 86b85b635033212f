"""The issue-14 API surface used on spawned processes (one job checks every method)."""

from __future__ import annotations

import json
import pathlib

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from accel import Accelerator, AcceleratorConfigError, DistributedDataParallelKwargs
from accel.local_sgd import LocalSGD
from accel.state import AcceleratorState, PartialState
from accel.test_utils import are_the_same_tensors
from accel.utils import ProfileKwargs
from accel.utils.operations import DistributedOperationException


def _linear(seed: int, inputs: int, outputs: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(inputs, outputs)


def _same_everywhere(tensor: torch.Tensor) -> bool:
    return bool(are_the_same_tensors(tensor.detach().clone()))


def _comm_hooks(rank: int) -> dict:
    """fp16 compression and PowerSGD (with an fp16 wrapper) registered on the DDP model."""
    out: dict = {}
    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="fp16")]
    )
    model = accelerator.prepare(_linear(0, 4, 1))
    accelerator.backward(model(torch.full((2, 4), rank + 1.0 / 3)).sum())
    grad = accelerator.unwrap_model(model).weight.grad
    out["fp16_hooks"] = len(getattr(model, "_comm_hooks", []))
    out["fp16_grad_is_half"] = bool(torch.equal(grad.half().float(), grad))
    out["fp16_grad"] = grad.flatten().tolist()

    power = DistributedDataParallelKwargs(
        comm_hook="power_sgd",
        comm_wrapper="fp16",
        comm_state_option={"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
    )
    accelerator = Accelerator(cpu=True, kwargs_handlers=[power])
    model = accelerator.prepare(_linear(0, 16, 8))
    for step in range(3):
        model.zero_grad()
        accelerator.backward(model(torch.randn(4, 16) * (rank + step + 1)).pow(2).sum())
    weight_grad = accelerator.unwrap_model(model).weight.grad
    out["power_sgd_hooks"] = len(getattr(model, "_comm_hooks", []))
    # PowerSGD sends a rank-1 approximation (P Q^T); the fp16 wrapper rounds it to half.
    out["power_sgd_rank"] = int(torch.linalg.matrix_rank(weight_grad, rtol=1e-2))
    out["power_sgd_full_rank"] = int(torch.linalg.matrix_rank(weight_grad.double()))
    out["power_sgd_is_half"] = bool(torch.equal(weight_grad.half().float(), weight_grad))
    out["power_sgd_same"] = _same_everywhere(weight_grad)
    return out


def _uneven_and_triggers(accelerator: Accelerator) -> dict:
    out: dict = {}
    rank = accelerator.process_index
    model = accelerator.prepare(_linear(1, 2, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(DataLoader(torch.arange(10.0).view(5, 2), batch_size=1))
    batches = 0
    with accelerator.join_uneven_inputs([model], even_batches=False):
        for batch in loader:
            accelerator.backward(model(batch).sum())
            optimizer.step()
            optimizer.zero_grad()
            batches += 1
    out["join_batches"] = batches
    out["even_batches_restored"] = getattr(loader.batch_sampler, "even_batches", None)
    out["batches_after_join"] = len(list(loader))

    inputs = torch.full((1, 2), float(rank + 1))
    with accelerator.no_sync(model):
        accelerator.backward(model(inputs).sum())
    out["no_sync_same"] = _same_everywhere(accelerator.unwrap_model(model).weight.grad)
    optimizer.zero_grad()
    with accelerator.no_sync(model), accelerator.trigger_sync_in_backward(model):
        accelerator.backward(model(inputs).sum())
    out["trigger_sync_same"] = _same_everywhere(accelerator.unwrap_model(model).weight.grad)
    optimizer.zero_grad()

    out["trigger_before"] = accelerator.check_trigger()
    if accelerator.is_last_process:
        accelerator.set_trigger()
    out["trigger_after_set"] = accelerator.check_trigger()
    out["trigger_after_seen"] = accelerator.check_trigger()
    return out


def _local_sgd(accelerator: Accelerator) -> dict:
    rank = accelerator.process_index
    model = accelerator.prepare(_linear(2, 3, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    same_after_step = []
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        for step in range(3):
            accelerator.backward(model(torch.full((2, 3), float(rank + step + 1))).sum())
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            same_after_step.append(_same_everywhere(accelerator.unwrap_model(model).weight))
    same_after_exit = _same_everywhere(accelerator.unwrap_model(model).weight)
    return {"local_sgd_same": same_after_step, "local_sgd_same_after_exit": same_after_exit}


def _profile(accelerator: Accelerator, folder: pathlib.Path) -> dict:
    handler = ProfileKwargs(output_trace_dir=str(folder / "traces"), record_shapes=True)
    with accelerator.profile(handler) as profiler:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    trace = folder / "traces" / f"profile_{accelerator.process_index}.json"
    events = json.loads(trace.read_text())["traceEvents"]
    return {
        "trace_events": len(events),
        "profiled_mm": any("mm" in str(e.get("name", "")) for e in events),
        "profiler_averages": len(profiler.key_averages()) > 0,
    }


def _debug_and_reset(accelerator: Accelerator) -> dict:
    out: dict = {}
    rank = accelerator.process_index
    state = PartialState()
    state.debug = True
    try:
        accelerator.gather(torch.ones(rank + 1))
        out["debug_error"] = None
    except DistributedOperationException as error:
        out["debug_error"] = type(error).__name__
    finally:
        state.debug = False

    world = accelerator.num_processes
    AcceleratorState._reset_state()
    out["partial_alive"] = PartialState().initialized and (world == 1 or dist.is_initialized())
    try:
        accelerator.prepare(torch.nn.Linear(1, 1))
        out["prepare_after_reset"] = "no error"
    except AcceleratorConfigError as error:
        out["prepare_after_reset"] = str(error)
    fresh = Accelerator(cpu=True)
    out["fresh_reduce"] = fresh.reduce(torch.tensor([1.0])).item()
    return out


def surface_job(folder: str) -> dict:
    """Every issue-14 method on this process; returns what each one did."""
    accelerator = Accelerator(cpu=True)
    out = {"rank": accelerator.process_index}
    out.update(_comm_hooks(accelerator.process_index))
    out.update(_uneven_and_triggers(accelerator))
    out.update(_local_sgd(accelerator))
    out.update(_profile(accelerator, pathlib.Path(folder)))
    out.update(_debug_and_reset(accelerator))
    return out
