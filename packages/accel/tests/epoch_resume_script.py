"""Exact resume at an epoch boundary and mid-epoch: ``torchrun ... epoch_resume_script.py OUT``.

Trains with shuffling (no generator), dropout, AdamW and a LambdaLR scheduler, and a registered
custom object, with automatic checkpoint naming and ``total_limit=2``:

``--phase train`` runs epochs 0-2 with ``save_state()`` after each (checkpoints 0-2), epoch 3 with
a ``save_state()`` after its batch ``MID`` (checkpoint 3, mid-epoch; checkpoints 0 and 1 are
gone), then epoch 4. In the same process it then loads checkpoint 2 and trains epochs 3-4
again, and loads checkpoint 3 and finishes epoch 3 and trains epoch 4 again (twice: with the
loader itself, and Accelerate's way with ``skip_first_batches`` for the rest of epoch 3).

``--phase resume --checkpoint PATH`` (a fresh process, another seed) loads ``PATH`` (the newest
checkpoint when empty) and trains to the end of epoch 4.

Every process writes ``OUT/results/<tag>/rank<r>.json``: per run, one ``[epoch, batch, loss, lr]`` per
batch (``repr`` of the floats) and the final weights.
"""

import argparse
import json
import pathlib

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed

EPOCHS, MID = 5, 2

parser = argparse.ArgumentParser()
parser.add_argument("project_dir")
parser.add_argument("--phase", choices=["train", "resume"], required=True)
parser.add_argument("--checkpoint", default="")
parser.add_argument("--seed", type=int, default=11)
parser.add_argument("--tag", default="train", help="name of the results folder")
args = parser.parse_args()

set_seed(args.seed)
config = ProjectConfiguration(
    project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
)
accelerator = Accelerator(project_config=config)
data_generator = torch.Generator().manual_seed(0)
data = TensorDataset(
    torch.randn(40, 5, generator=data_generator), torch.randn(40, 1, generator=data_generator)
)
model = torch.nn.Sequential(
    torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
loader = DataLoader(data, batch_size=4, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)


class Progress:
    """Where training stands: the epoch in progress and the batches it has done."""

    def __init__(self) -> None:
        self.epoch, self.batch = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch = state["epoch"], state["batch"]


progress = Progress()
accelerator.register_for_checkpointing(progress)


def train(records: list, save_mid_epoch: bool = False, skip_first: bool = False) -> None:
    """Train from ``progress`` to the end; save after each of epochs 0-2 and mid-epoch 3.

    ``skip_first``: continue a resumed epoch as Accelerate's examples do, through
    ``skip_first_batches`` for that epoch.
    """
    while progress.epoch < EPOCHS:
        model.train()
        active = loader
        if skip_first and progress.batch:
            active = accelerator.skip_first_batches(loader, progress.batch)
        for x, y in active:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            lr = scheduler.get_last_lr()[0]
            records.append([progress.epoch, progress.batch, repr(loss.item()), repr(lr)])
            progress.batch += 1
            if save_mid_epoch and progress.epoch == 3 and progress.batch == MID + 1:
                accelerator.save_state()
        progress.epoch, progress.batch = progress.epoch + 1, 0
        if save_mid_epoch and progress.epoch <= 3:
            accelerator.save_state()


def weights() -> list[str]:
    unwrapped = accelerator.unwrap_model(model)
    return [repr(value) for p in unwrapped.parameters() for value in p.flatten().tolist()]


checkpoints = pathlib.Path(args.project_dir) / "checkpoints"
runs: dict[str, dict] = {}
if args.phase == "train":
    records: list = []
    train(records, save_mid_epoch=True)
    runs["uninterrupted"] = {"records": records, "weights": weights()}
    runs["checkpoints"] = sorted(path.name for path in checkpoints.iterdir())
    for name, checkpoint, skip_first in (
        ("same_boundary", "checkpoint_2", False),
        ("same_mid", "checkpoint_3", False),
        ("same_mid_skip_first_batches", "checkpoint_3", True),
    ):
        accelerator.load_state(str(checkpoints / checkpoint))
        records = []
        train(records, skip_first=skip_first)
        runs[name] = {"records": records, "weights": weights()}
else:
    accelerator.load_state(args.checkpoint or None)
    records = []
    train(records)
    runs["resumed"] = {"records": records, "weights": weights()}

out = pathlib.Path(args.project_dir) / "results" / args.tag
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(runs))
accelerator.end_training()
