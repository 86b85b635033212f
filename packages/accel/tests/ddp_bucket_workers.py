"""DDP with and without accel's bucket hook, run on spawned processes by test_ddp_buckets.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from accel.strategies.ddp.buckets import SteadyBuckets
from accel_state import PartialState

STEPS = 8


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 300),
        torch.nn.Tanh(),
        torch.nn.Linear(300, 300),
        torch.nn.Tanh(),
        torch.nn.Linear(300, 1),
    )


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    return [
        (torch.randn(16, 32, generator=generator), torch.randn(16, 1, generator=generator))
        for _ in range(STEPS)
    ]


def _wrap(
    hook: bool, state: dict | None = None
) -> tuple[DistributedDataParallel, torch.optim.Optimizer, SteadyBuckets | None]:
    model = _model()
    if state is not None:
        model.load_state_dict(state["model"])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.2)  # buckets of 0.2 MB: two, rebuilt
    steady = None
    if hook:
        steady = SteadyBuckets(ddp)
        steady.register()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    return ddp, optimizer, steady


def _train(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, batches: list) -> None:
    for inputs, targets in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()


def _weights(ddp: DistributedDataParallel) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in ddp.module.state_dict().items()}


def _equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(first[key], second[key]) for key in first)


def sums_and_resumes() -> dict:
    """The hook against DDP's own sum; a resume in the saved buckets, and one without them."""
    PartialState(cpu=True)  # the gloo group of the spawned processes
    batches = _batches()
    plain, optimizer, _ = _wrap(hook=False)
    _train(plain, optimizer, batches)
    hooked, optimizer, _ = _wrap(hook=True)
    _train(hooked, optimizer, batches)

    outcomes = {}
    # Saved after 4 steps (DDP's buckets rebuilt and seen by the hook), and after the first
    # step (the rebuild recorded but not made yet: the save makes it).
    for split in (STEPS // 2, 1):
        first, optimizer, steady = _wrap(hook=True)
        assert steady is not None and steady.layout() is None  # no step yet: initial buckets
        _train(first, optimizer, batches[:split])
        layout = steady.layout()
        assert layout is not None
        state = {"model": _weights(first), "optimizer": optimizer.state_dict()}
        for keeps_layout in (True, False):
            resumed, optimizer, steady = _wrap(hook=True, state=state)
            if keeps_layout:
                assert steady is not None
                steady.resume_in(layout)
            _train(resumed, optimizer, batches[split:])
            outcomes[split, keeps_layout] = _equal(_weights(resumed), _weights(hooked))
    initial = [[name for name, _ in _model().named_parameters()]]
    return {
        "hook_equals_ddp": _equal(_weights(plain), _weights(hooked)),
        "resumed_in_saved_layout": outcomes[STEPS // 2, True],
        "resumed_in_initial_layout": outcomes[STEPS // 2, False],
        "resumed_after_the_first_step": outcomes[1, True],
        "buckets": len(layout),
        "layout_was_rebuilt": layout != initial,
    }
