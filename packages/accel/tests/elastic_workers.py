"""Elastic resume: a mid-epoch checkpoint saved on 2 processes resumed on 1 and 3 (spawned)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel import Accelerator
from accel_data import ResumeStateError
from accel_state import reset_state

SAMPLES, BATCH, SAVE_AT = 48, 2, 3  # 24 batches of 2; 2 processes save after 3 steps


class Ids(torch.utils.data.Dataset):
    """Sample ``i`` is the id ``i``."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


class Stream(IterableDataset):
    """An iterable dataset (sharded by rank when prepared)."""

    def __iter__(self):
        return iter(range(SAMPLES))


def _setup(folder: str, fsdp: bool) -> tuple[Accelerator, Any, Any, Any]:
    from accel_ckpt import ProjectConfiguration

    reset_state(stop_process_group=False)
    kwargs: dict[str, Any] = {}
    if fsdp:
        from accel import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config, **kwargs)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Ids(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def _global(accelerator: Accelerator, batch: torch.Tensor) -> list[int]:
    """The ids of one step of the whole job, in rank order (= the epoch's global order)."""
    return accelerator.gather(batch).tolist()


def _step(accelerator: Accelerator, model: Any, optimizer: Any, batch: torch.Tensor) -> None:
    loss = model(batch.float().unsqueeze(1).expand(-1, 4)).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def save_job(folder: str, fsdp: bool) -> dict[str, Any]:
    """2 processes: epoch 0 until step SAVE_AT, save, then the rest of epoch 0 and epoch 1."""
    accelerator, model, optimizer, loader = _setup(folder, fsdp)
    before, after = [], []
    for step, batch in enumerate(loader):
        (before if step < SAVE_AT else after).extend(_global(accelerator, batch))
        _step(accelerator, model, optimizer, batch)
        if step + 1 == SAVE_AT:
            accelerator.save_state()
    epoch1 = [i for batch in loader for i in _global(accelerator, batch)]
    return {"before": before, "after": after, "epoch1": epoch1}


def resume_job(folder: str, fsdp: bool) -> dict[str, Any]:
    """Any number of processes: load the checkpoint, finish epoch 0, run epoch 1."""
    accelerator, model, optimizer, loader = _setup(folder, fsdp)
    accelerator.load_state()
    rest = []
    for batch in loader:
        rest.extend(_global(accelerator, batch))
        _step(accelerator, model, optimizer, batch)
    epoch1 = [i for batch in loader for i in _global(accelerator, batch)]
    return {"rest": rest, "epoch1": epoch1, "refusal": _refusal(accelerator)}


def _refusal(accelerator: Accelerator) -> str:
    """What loading a 5-process mid-epoch state into an iterable-dataset loader says."""
    stream = accelerator.prepare(DataLoader(Stream(), batch_size=BATCH))
    state = stream.state_dict()
    state.update(num_processes=5, batches_yielded=2, samples_consumed=None)
    try:
        stream.load_state_dict(state)
    except ResumeStateError as error:
        return str(error)
    return ""
