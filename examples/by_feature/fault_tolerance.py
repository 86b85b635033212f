"""A training job that survives: it restarts where it stopped, and stops cleanly when preempted.

Run it on 2 CPU processes, with up to 3 automatic restarts of the workers:

    accel launch --cpu --num_processes 2 --max_restarts 3 examples/by_feature/fault_tolerance.py

It works the same under FSDP (``--use_fsdp``) and DeepSpeed (``--use_deepspeed --zero_stage 2``).
``--background_saves`` saves with ``save_state(blocking=False)``: the loop goes on as soon as the
state is copied into host memory, and the checkpoint is written and published behind it.

* **Restart and resume.** If a worker dies (out of memory, a lost node, ``kill -9``), torch
  elastic restarts every worker and the script runs again from the top. The three lines after
  ``prepare`` resume from the newest complete checkpoint, and do nothing on the first start:
  model, optimizer, scheduler, the data loader's position inside the epoch, every process's RNG
  and the registered ``Progress`` come back exactly, so the job ends with the same weights as one
  that was never interrupted. ``accelerator.restart_count`` says which attempt this is.
* **Preemption.** Schedulers send SIGTERM before they kill a job; ``accel launch`` passes it to
  every worker. ``accelerator.should_stop`` (read once per step, on every process) becomes True
  on every process at the same step; the script saves and returns, and ``accel launch`` exits
  with status 75, which asks the scheduler to requeue the job (SLURM: ``RequeueExit=75``).
  Running the same command again finishes the job.
* **Changing size.** A checkpoint resumes on another number of processes (model, optimizer,
  scheduler and the data position; the rest of the epoch is exactly the samples not seen yet).
  To go on without a machine that is lost for good, start one launcher per machine with a range
  (torch elastic's ``--nnodes MIN:MAX``)::

      accel launch --num_machines 2:3 --num_processes 3 --max_restarts 1 \
          --main_process_ip HOST --main_process_port 29500 examples/by_feature/fault_tolerance.py

  the remaining machines restart as a smaller job and resume from the newest checkpoint.
* **Hangs.** A collective that one process never enters (a ``gather`` under
  ``if accelerator.is_main_process:``) raises on every process after the collective timeout
  (``--collective_timeout``; 5 minutes after the first step by default), naming the operation
  and line each process waits in.

The model and data are tiny and synthetic, so the script runs in seconds.
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Callable, Sequence

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed


class Progress:
    """Where training stands: the epoch in progress and the optimizer steps taken so far."""

    def __init__(self) -> None:
        self.epoch = 0
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        """What ``save_state`` stores for it."""
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore it from what ``load_state`` read."""
        self.epoch, self.step = state["epoch"], state["step"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A job that resumes after restarts.")
    parser.add_argument("--project_dir", default="runs/fault_tolerance")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8, help="per process")
    parser.add_argument("--checkpoint_every", type=int, default=5, help="optimizer steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--background_saves",
        action="store_true",
        help="periodic saves with save_state(blocking=False): written while training goes on",
    )
    return parser.parse_args(argv)


def make_data() -> TensorDataset:
    """128 points of a noisy 4-class problem in 16 dimensions, the same on every process."""
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(128, 16, generator=generator)
    targets = (inputs[:, :4] + 0.3 * torch.randn(128, 4, generator=generator)).argmax(dim=1)
    return TensorDataset(inputs, targets)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
    )


StepHook = Callable[[Accelerator, int], None]


def train(args: argparse.Namespace, on_step: StepHook | None = None) -> bool:
    """Train to the end, or until preempted; return whether the job finished.

    Args:
        args: The command line.
        on_step: Called after every optimizer step with the step number (tests use it to die
            or to slow down at a given step).
    """
    set_seed(args.seed)
    accelerator = Accelerator(
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
        )
    )
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(make_data(), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.05 * step))
    scheduler = accelerator.prepare(scheduler)

    progress = Progress()
    accelerator.register_for_checkpointing(progress)  # saved and loaded with everything else
    if accelerator.latest_checkpoint() is not None:  # a restart or a relaunch: continue
        accelerator.load_state()  # the newest complete checkpoint, data position included
        accelerator.print(
            f"attempt {accelerator.restart_count}: resumed at epoch {progress.epoch}, "
            f"step {progress.step}"
        )

    while progress.epoch < args.epochs:
        model.train()
        for inputs, targets in loader:  # after load_state: from the saved position on
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if on_step is not None:
                on_step(accelerator, progress.step)
            stop = accelerator.should_stop  # the same answer on every process
            if stop or progress.step % args.checkpoint_every == 0:
                # The next save_state/load_state waits for a background save still running.
                accelerator.save_state(blocking=stop or not args.background_saves)
            if stop:
                accelerator.print(
                    f"SIGTERM: saved after step {progress.step}; exiting so the job is requeued"
                )
                return False
        progress.epoch += 1
    accelerator.save_model(model, pathlib.Path(args.project_dir) / "final")
    accelerator.print(f"finished after {progress.step} steps")
    return True


def main() -> None:
    train(parse_args())


if __name__ == "__main__":
    main()
