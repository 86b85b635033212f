"""Train, evaluate and save until the host named ``--cut_host`` reaches ``--phase``; it stays there.

``python cut_phase.py OUT --phase PHASE --strategy ddp|fsdp2 --cut_host node1``, under
``accel launch`` on every test host. The phases, where the cut host stops:

* ``forward``: at the start of the forward pass of step 2 (where DDP rebuilds its buckets);
* ``backward``: in the backward pass of step 3 (a hook on the gradient of the output);
* ``optimizer``: in the optimizer step of step 3 (a step pre-hook);
* ``data``: reading a sample of the third batch;
* ``save_state``: inside ``save_state`` (a save-state pre-hook);
* ``evaluation``: just before the first ``gather_for_metrics`` of the evaluation;
* ``between_epochs``: after the first epoch's ``save_state``, before the second epoch.

On reaching it, the cut host's ranks write ``OUT/at-phase`` and sleep there: the test cuts the
host's link as soon as the file appears, and the other machine's ranks go on into the next
collective (in that phase or the following one), where they wait for the cut host's.
"""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator
from accel.utils import FullyShardedDataParallelPlugin

PHASES = (
    "forward",
    "backward",
    "optimizer",
    "data",
    "save_state",
    "evaluation",
    "between_epochs",
)
#: How long the cut host stays in the phase: past any timeout of the job.
STAY_SECONDS = 600


class Where:
    """The phase the cut host stops in, and the training step in progress."""

    def __init__(self, out: Path, phase: str, cut_here: bool) -> None:
        self.out, self.phase, self.cut_here = out, phase, cut_here
        self.step = -1  # 0-based; -1 before the first

    def stop_if(self, phase: str, step: int | None = None) -> None:
        """Stay here for good when this is the cut host, in ``phase`` (at ``step`` if given)."""
        if not self.cut_here or phase != self.phase:
            return
        if step is not None and self.step != step:
            return
        (self.out / "at-phase").write_text(phase)
        time.sleep(STAY_SECONDS)


class Samples(Dataset):
    """64 samples of a 3-class problem; reading sample ``stop_at`` may stop (the data phase)."""

    def __init__(self, where: Where, stop_at: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 8, generator=generator)
        self.y = torch.randint(0, 3, (64,), generator=generator)
        self.where, self.stop_at = where, stop_at

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.stop_at:
            self.where.stop_if("data")
        return self.x[index], self.y[index]


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("out", type=Path)
    options.add_argument("--phase", choices=PHASES, required=True)
    options.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp")
    options.add_argument("--cut_host", default="node1")
    args = options.parse_args()

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if args.strategy == "fsdp2" else None
    accelerator = Accelerator(fsdp_plugin=plugin)
    where = Where(args.out, args.phase, socket.gethostname() == args.cut_host)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    # The third batch of this rank: samples are dealt out in rank order, 4 per batch.
    per_step = 4 * accelerator.num_processes
    third = 2 * per_step + 4 * accelerator.process_index
    training = DataLoader(Samples(where, third), batch_size=4)
    evaluation = DataLoader(Samples(where, -1), batch_size=4)
    model = accelerator.prepare(model)
    # On the prepared model, first: before DDP's forward (its bucket rebuild) or FSDP's gather.
    model.register_forward_pre_hook(
        lambda module, inputs: where.stop_if("forward", step=1), prepend=True
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.register_step_pre_hook(lambda *_: where.stop_if("optimizer", step=2))
    optimizer, training, evaluation = accelerator.prepare(optimizer, training, evaluation)
    accelerator.register_save_state_pre_hook(lambda *_: where.stop_if("save_state"))
    for epoch in range(2):
        model.train()
        for step, (inputs, targets) in enumerate(training):
            where.step = step
            output = model(inputs)
            if step == 2:
                output.register_hook(lambda grad: (where.stop_if("backward", step=2), grad)[1])
            loss = torch.nn.functional.cross_entropy(output, targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        for inputs, targets in evaluation:
            with torch.no_grad():
                predictions = model(inputs).argmax(dim=1)
            where.stop_if("evaluation")
            accelerator.gather_for_metrics((predictions, targets))
        accelerator.save_state(str(args.out / "state"))
        if epoch == 0:
            where.stop_if("between_epochs")
    accelerator.end_training()


if __name__ == "__main__":
    main()
