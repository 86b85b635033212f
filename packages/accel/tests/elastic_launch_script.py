"""DDP training run by ``accel launch --num_machines 2:3 --max_restarts 1`` (one launcher per worker).

Every worker appends JSON lines to ``LOGS/<launcher>.jsonl`` (the launcher's name comes from its
``--env LAUNCHER=name``). The script saves state every ``SAVE_EVERY`` steps and, on start, loads
the newest checkpoint if one exists. In the first round (restart 0, 3 workers) every worker stops
after step ``PAUSE_AT`` and waits for the file ``LOGS/go``: the test kills one launcher meanwhile,
then writes ``go``; the survivors' next collective fails and torch elastic restarts them as a
2-worker job, which resumes from the checkpoint saved at step ``SAVE_EVERY``.

Rank 0 also records the plain PyTorch order of both epochs (the uninterrupted order: a prepared
loader yields it on any number of processes, see test_sampler_order.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

SAMPLES, BATCH, EPOCHS = 48, 2, 2
SAVE_EVERY, PAUSE_AT, FIRST_WORLD = 2, 3, 3


class Ids(Dataset[int]):
    """Sample ``i`` is the id ``i``."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> int:
        return index


class Progress:
    """Epoch and optimizer steps done, saved with the state."""

    def __init__(self) -> None:
        self.epoch = 0
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.steps = state["epoch"], state["steps"]


def _log(logs: Path, record: dict[str, Any]) -> None:
    line = json.dumps({**record, "launcher": os.environ["LAUNCHER"]})
    with (logs / f"{os.environ['LAUNCHER']}.jsonl").open("a") as handle:
        handle.write(line + "\n")


def _plain_order() -> list[list[int]]:
    """Both epochs' order of a plain DataLoader from here, the global generator left alone."""
    state = torch.get_rng_state()
    loader = DataLoader(Ids(), batch_size=BATCH, shuffle=True)
    order = [[i for batch in loader for i in batch.tolist()] for _ in range(EPOCHS)]
    torch.set_rng_state(state)
    return order


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--logs", type=Path, required=True)
    args = parser.parse_args()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if restart == 0 and world < FIRST_WORLD:
        # The first round closed before every launcher joined: the agents restart the workers
        # (not counted as a restart) once the late launcher waits; train only with all three.
        _log(args.logs, {"event": "early", "world": world})
        while True:
            time.sleep(1)

    from accel import Accelerator
    from accel.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(args.project), automatic_checkpoint_naming=True)
    accelerator = Accelerator(project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    reference = _plain_order()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Ids(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    newest = accelerator.latest_checkpoint()
    if newest is not None:
        accelerator.load_state()
    start = {"event": "start", "restart": restart, "world": world, "rank": rank}
    _log(args.logs, {**start, "resumed_from": newest and newest.name, "steps": progress.steps})
    if rank == 0:
        _log(args.logs, {"event": "reference", "order": reference})
    for epoch in range(progress.epoch, EPOCHS):
        progress.epoch = epoch
        for batch in loader:
            ids = accelerator.gather(batch).tolist()
            if rank == 0:
                _log(args.logs, {"event": "step", "restart": restart, "epoch": epoch, "ids": ids})
            loss = model(batch.float().unsqueeze(1).expand(-1, 4)).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.steps += 1
            if progress.steps % SAVE_EVERY == 0:
                accelerator.save_state()
            if restart == 0 and progress.steps == PAUSE_AT:
                _log(args.logs, {"event": "paused", "rank": rank})
                while not (args.logs / "go").exists():
                    time.sleep(0.1)
        progress.epoch = epoch + 1
    accelerator.wait_for_everyone()
    _log(args.logs, {"event": "done", "restart": restart, "world": world, "rank": rank})
    accelerator.end_training()


if __name__ == "__main__":
    main()
