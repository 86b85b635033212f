"""DiLoCo across replica groups: ``LocalSGD(..., diloco=DiLoCoSettings(...))`` (test worker).

Run by ``accel launch --ft_replicas N``. An ordinary loop inside one ``LocalSGD`` block; what is
test-only is the record it leaves in ``--out`` and the planned failures (``--kill``, as in
``ft_everyday.py``; a step is one batch here):

* ``rounds-r<replica>-p<rank>.jsonl``: one line per sync that ended in this process: life,
  pid, epoch, the sample indices this process trained in the round, committed or not, the
  quorum's participants, the round's mean training loss;
* ``final-r<replica>-p<rank>.pt``: the model's parameters at the end (after the last sync);
* ``loss-r<replica>-p<rank>.json``: the loss over the whole training set before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from ft_everyday import Killer, Numbered, local_copy
from torch.utils.data import DataLoader

from accel import Accelerator
from accel.local_sgd import LocalSGD
from accel.utils import DiLoCoSettings, set_seed


def parser() -> argparse.ArgumentParser:
    """The worker's options."""
    options = argparse.ArgumentParser(description=__doc__)
    options.add_argument("--out", type=Path, required=True)
    options.add_argument("--epochs", type=int, default=2)
    options.add_argument("--samples", type=int, default=96)
    options.add_argument("--batch_size", type=int, default=4)
    options.add_argument("--sync_every", type=int, default=4)
    options.add_argument("--fragments", type=int, default=1)
    options.add_argument("--delay", type=int, default=0, help="fragment_sync_delay")
    options.add_argument("--step_delay", type=float, default=0.02)
    options.add_argument("--solo_delay", type=float, default=0.5)
    options.add_argument("--kill", action="append", default=[])
    return options


def full_loss(model: torch.nn.Module, dataset: Numbered) -> float:
    """Mean squared error over the whole dataset."""
    with torch.no_grad():
        prediction = model(dataset.inputs)
        return float(torch.nn.functional.mse_loss(prediction, dataset.targets))


def main() -> None:
    """Train ``--epochs`` epochs in DiLoCo rounds."""
    args = parser().parse_args()
    replica = int(os.environ["ACCEL_FT_REPLICA_ID"])
    replicas = int(os.environ["ACCEL_FT_REPLICAS"])
    life = int(os.environ.get("ACCEL_FT_GROUP_RESTART_COUNT", "0"))
    set_seed(0)
    accelerator = Accelerator()
    rank = accelerator.process_index
    killer = Killer(args.kill, args.out, replica, life, rank, False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    dataset = Numbered(args.samples, 1)
    train = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    model, optimizer, train = accelerator.prepare(model, optimizer, train)
    settings = DiLoCoSettings(fragments=args.fragments, fragment_sync_delay=args.delay)
    local_sgd = LocalSGD(accelerator, model, args.sync_every, diloco=settings)
    training = accelerator.replica_training
    rounds_file = (args.out / f"rounds-r{replica}-p{rank}.jsonl").open("a")
    indices: list[int] = []
    losses: list[float] = []
    round_ended = training.round_ended

    def recording(committed: bool) -> None:
        if indices:
            line = {
                "life": life,
                "pid": os.getpid(),
                "epoch": train.position.epoch,
                "indices": list(indices),
                "committed": committed,
                "participants": training.manager.participants,
                "loss": sum(losses) / len(losses),
                "time": time.time(),
            }
            rounds_file.write(json.dumps(line) + "\n")
            rounds_file.flush()
        indices.clear()
        losses.clear()
        round_ended(committed)

    training.round_ended = recording  # type: ignore[method-assign]
    before = full_loss(accelerator.unwrap_model(model), dataset)
    with local_sgd:
        for _ in range(args.epochs):
            model.train()
            for inputs, targets, index in train:
                killer.point("forward")
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                indices.extend(int(i) for i in index)
                losses.append(float(loss))
                killer.point("optimizer")
                local_sgd.step()
                killer.step += 1
                split = training.round_split
                together = split is not None and split[1] == replicas
                time.sleep(args.step_delay if together else args.solo_delay)
    parameters = {
        name: tensor.detach().clone()
        for name, tensor in accelerator.unwrap_model(model).state_dict().items()
    }
    after = full_loss(accelerator.unwrap_model(model), dataset)
    record: dict[str, Any] = {
        "before": before,
        "after": after,
        "committed_steps": training.manager.committed_steps,
        "syncs": [local_sgd.rounds.committed_syncs, local_sgd.rounds.failed_syncs]
        if local_sgd.rounds is not None
        else None,
    }
    (args.out / f"loss-r{replica}-p{rank}.json").write_text(json.dumps(record))
    torch.save(local_copy(parameters), args.out / f"final-r{replica}-p{rank}.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main()
