"""Training functions run inside spawned worker processes (importable by module name)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator

FEATURES = 4


class IndexedRegression(Dataset):
    """``n`` fixed samples ``(x, y, index)`` of a noisy linear target."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, FEATURES, generator=generator)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(
            n, generator=generator
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[index], self.y[index], index


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1)


def train_with_accumulation(n: int, batch_size: int, accumulation: int, lr: float) -> dict:
    """Train and record, per optimizer step, the samples this rank saw and the weights after it."""
    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(IndexedRegression(n), batch_size=batch_size, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps: list[dict] = []
    seen: list[int] = []
    violations: list[str] = []
    for x, y, index in loader:
        with accelerator.accumulate(model):
            before = [p.detach().clone() for p in model.parameters()]
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
            accelerator.backward(loss)
            seen.extend(index.tolist())
            optimizer.step()
            optimizer.zero_grad()
            after = [p.detach().clone() for p in model.parameters()]
            if accelerator.sync_gradients:
                steps.append(
                    {"indices": list(seen), "weights": [t.double().tolist() for t in after]}
                )
                seen = []
            elif any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)):
                violations.append("parameters changed on a non-sync micro-step")
    final = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    return {
        "steps": steps,
        "final": [t.tolist() for t in final],
        "violations": violations,
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
    }


def local_gradients_on_non_sync_steps() -> dict:
    """On a non-sync micro-step DDP must not all-reduce: each rank keeps its own gradient."""
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = accelerator.prepare(make_model())
    rank = accelerator.process_index
    x = torch.full((2, FEATURES), float(rank + 1))
    with accelerator.accumulate(model):  # step 1 of 2: no sync
        accelerator.backward(model(x).sum())
        unsynced = [p.grad.clone().tolist() for p in model.parameters()]
    with accelerator.accumulate(model):  # step 2 of 2: sync
        accelerator.backward(model(x).sum())
        synced = [p.grad.clone().tolist() for p in model.parameters()]
    return {"unsynced": unsynced, "synced": synced}


def gather_for_metrics_run(n: int, batch_size: int, as_objects: bool) -> list:
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(list(range(n)), batch_size=batch_size))
    collected: list = []
    for batch in loader:
        if as_objects:
            collected.extend(accelerator.gather_for_metrics([f"s{i}" for i in batch.tolist()]))
        else:
            collected.extend(accelerator.gather_for_metrics({"i": batch})["i"].tolist())
    return collected


def timeouts_around_the_first_step(explicit: bool) -> dict:
    """The gloo timeouts of the default and the checkpoint group before and after the first step."""
    import datetime

    import torch.distributed as dist

    from accel import InitProcessGroupKwargs
    from accel_ckpt._coordination import _checkpoint_group

    handlers = [InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=42))] if explicit else []
    accelerator = Accelerator(kwargs_handlers=handlers)
    model, optimizer = accelerator.prepare(
        make_model(), torch.optim.SGD(make_model().parameters(), lr=0.1)
    )

    def seconds(group: object) -> float:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()  # type: ignore[attr-defined]

    checkpoint_group = _checkpoint_group(accelerator.state.partial.timeout)
    before = (seconds(dist.group.WORLD), seconds(checkpoint_group))
    for _ in range(3):
        accelerator.backward(model(torch.ones(2, FEATURES)).sum())
        optimizer.step()
        optimizer.zero_grad()
    after = (seconds(dist.group.WORLD), seconds(checkpoint_group))
    return {
        "before": before,
        "after": after,
        "state": accelerator.state.partial.timeout.total_seconds(),
    }


def slow_rank_reports(slow_rank: int, slow_seconds: float, steps: int) -> list[str]:
    """Train ``steps`` steps, ``slow_rank`` sleeping ``slow_seconds`` in each; the reports made."""
    import time

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(
        make_model(), torch.optim.SGD(make_model().parameters(), lr=0.1)
    )
    monitor = accelerator.fault_tolerance
    reports = []
    for _ in range(steps):
        if accelerator.process_index == slow_rank:
            time.sleep(slow_seconds)
        accelerator.backward(model(torch.ones(2, FEATURES)).sum())
        optimizer.step()
        optimizer.zero_grad()
        if monitor.slow_ranks is not None and monitor.slow_ranks.last_report not in reports:
            reports.append(monitor.slow_ranks.last_report)
    return [report for report in reports if report]


class _SlowWhenAsked(Dataset):
    """``n`` samples; reading one sleeps while :data:`_SLOW_NOW` says ``"data"``."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        _sleep_in("data")
        return self.x[index]


#: The phase the slow rank is slow in right now ("" on the other ranks, and between phases).
_SLOW_NOW = {"phase": "", "seconds": 0.0}


def _sleep_in(phase: str) -> None:
    import time

    if _SLOW_NOW["phase"] == phase:
        time.sleep(_SLOW_NOW["seconds"])


def slow_rank_in_each_phase(
    slow_rank: int, seconds: float, phases: list[str], steps_per_phase: int
) -> dict:
    """Train on a real loader, ``slow_rank`` slow by ``seconds`` in each of ``phases`` in turn.

    Each phase lasts ``steps_per_phase`` steps: a dataset that sleeps while read ("data"), a
    forward pre-hook ("forward"), a hook on the gradient of the model's output, the first thing
    backward computes ("backward"), a step pre-hook of the optimizer ("optimizer"); "" is none.
    Returns the reports with the step (0-based) at which each was made, and the windows judged.
    """
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = steps_per_phase * len(phases)
    loader = DataLoader(_SlowWhenAsked(steps * accelerator.num_processes), batch_size=1)
    model.register_forward_pre_hook(lambda module, args: _sleep_in("forward"))
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: _sleep_in("optimizer"))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    mine = accelerator.process_index == slow_rank
    reports: list[tuple[int, str]] = []
    last = ""
    for step, x in enumerate(loader):
        _SLOW_NOW.update(phase=phases[step // steps_per_phase] if mine else "", seconds=seconds)
        output = model(x)
        output.register_hook(lambda gradient: (_sleep_in("backward"), gradient)[1])
        accelerator.backward(output.sum())
        optimizer.step()
        optimizer.zero_grad()
        monitor = accelerator.fault_tolerance.slow_ranks
        if monitor is not None and monitor.last_report != last:
            last = monitor.last_report
            reports.append((step, last))
    monitor = accelerator.fault_tolerance.slow_ranks
    assert monitor is not None
    return {"reports": reports, "windows": monitor.windows, "enabled": monitor.enabled}


def slow_rank_report_around_uneven_inputs() -> int:
    """Rank 0 runs 5 backward passes inside Join, rank 1 runs 2; then both run 4 more."""
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(
        make_model(), torch.optim.SGD(make_model().parameters(), lr=0.1)
    )

    def step() -> None:
        accelerator.backward(model(torch.ones(2, FEATURES)).sum())
        optimizer.step()
        optimizer.zero_grad()

    with accelerator.join_uneven_inputs([model], even_batches=False):
        for _ in range(5 if accelerator.process_index == 0 else 2):
            step()
    for _ in range(4):  # the report's exchanges (every 2 passes) still pair up
        step()
    monitor = accelerator.fault_tolerance.slow_ranks
    assert monitor is not None
    return monitor._calls


def replica_groups_refuse_dp_replicate() -> str:
    """Fault tolerance with ``dp_replicate_size=2`` inside a group: the refusal's message."""
    from accel import FaultTolerancePlugin
    from accel.errors import UnsupportedFeatureError
    from accel_state import ParallelismConfig

    plugin = FaultTolerancePlugin(replica_id=0, replicas=2, lighthouse="http://127.0.0.1:1")
    try:
        Accelerator(
            parallelism_config=ParallelismConfig(dp_replicate_size=2), fault_tolerance=plugin
        )
    except UnsupportedFeatureError as error:
        return str(error)
    return "accepted"
