"""The everyday loop under replica groups: train, evaluate, save, resume (test worker).

Run by ``accel launch --ft_replicas N``. The loop is an ordinary Accelerate-style loop; what is
test-only is the record it leaves in ``--out`` and the planned failures:

* ``steps-r<replica>-p<rank>.jsonl``: one line per optimizer step (``--accumulation``
  micro-batches each): life (relaunch count), pid, the step's samples (epoch, first position,
  count), committed or not, participants, time;
* ``final-r<replica>-p<rank>.pt``: model, optimizer and scheduler state at the end;
* ``evals-r<replica>-p<rank>.jsonl``: evaluation loss per epoch (gathered inside the group).

``--hold REPLICA:LIFE:UNTIL`` (repeatable) holds that life of that group before its
``Accelerator`` starts until another group has finished the job (``finish``: the launcher's
``ACCEL_FT_JOB_FINISHED_FILE`` exists), until another group has written its final state
(``final``: it is ending its training), or for a number of seconds, so that a group arrives
late, after the end, or as the end is reached.

``--kill REPLICA:LIFE:PHASE:STEP`` (repeatable) SIGKILLs that process of that replica group in
that life (``*``: any) at the first step >= STEP (counting steps this process ran) in PHASE: ``forward``,
``backward``, ``allreduce`` (as the gradients go across groups), ``commit`` (after the vote,
before the optimizer steps), ``optimizer`` (inside the optimizer's step), ``save`` (inside
``save_state``), ``heal_source`` (while a healing group copies from this one), ``heal_target``
(as the copy arrives). REPLICA ``*`` means any group; each plan kills once in the whole job
(the first process to reach it claims it with a marker file in ``--out``). Only group rank 0
of a replica dies unless ``--kill_all_ranks``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed


class Numbered(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Regression samples that carry their own index."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.inputs = torch.randn(count, 8, generator=generator)
        self.targets = self.inputs @ torch.randn(8, 1, generator=generator) + 0.1
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.inputs[index], self.targets[index], index


def parser() -> argparse.ArgumentParser:
    """The worker's options."""
    options = argparse.ArgumentParser(description=__doc__)
    options.add_argument("--out", type=Path, required=True)
    options.add_argument("--epochs", type=int, default=2)
    options.add_argument("--samples", type=int, default=96)
    options.add_argument("--batch_size", type=int, default=4)
    options.add_argument("--step_delay", type=float, default=0.05)
    options.add_argument(
        "--solo_delay",
        type=float,
        default=1.0,
        help="pause after a step with fewer groups than the job has (a relaunch takes seconds)",
    )
    options.add_argument("--accumulation", type=int, default=1, help="micro-batches per step")
    options.add_argument("--kill", action="append", default=[])
    options.add_argument("--kill_all_ranks", action="store_true")
    options.add_argument("--resume", action="store_true", help="load the newest checkpoint")
    options.add_argument("--stop_after_epoch", type=int, default=-1)
    options.add_argument("--hold", action="append", default=[])
    return options


def hold(plans: list[str], out: Path, replica: int, life: int) -> None:
    """Wait as a ``--hold`` plan for this group and life says (see the module's docstring)."""
    for plan in plans:
        who, when, until = plan.split(":")
        if (who, when) != (str(replica), str(life)):
            continue
        if until not in ("finish", "final"):
            time.sleep(float(until))
            continue
        finished_file = Path(os.environ["ACCEL_FT_JOB_FINISHED_FILE"])
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if until == "finish" and finished_file.exists():
                break
            mine = f"final-r{replica}-p0.pt"
            if until == "final" and any(p.name != mine for p in out.glob("final-r*-p0.pt")):
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(f"--hold {plan}: nothing happened within 300 s")


class Killer:
    """SIGKILLs this process at a planned phase and step (each plan once in the whole job)."""

    def __init__(
        self, plans: list[str], out: Path, replica: int, life: int, rank: int, all_ranks: bool
    ):
        self.plans: list[tuple[int, str, int]] = []
        self.out = out
        for number, plan in enumerate(plans):
            who, when, phase, step = plan.split(":")
            if who in ("*", str(replica)) and when in ("*", str(life)) and (rank == 0 or all_ranks):
                self.plans.append((number, phase, int(step)))
        self.rank = rank
        self.step = 0

    def point(self, phase: str) -> None:
        """Die here if a plan says so and no other process carried it out yet."""
        for number, planned_phase, planned_step in self.plans:
            if planned_phase == phase and self.step >= planned_step:
                marker = self.out / f"kill-{number}-rank{self.rank}"
                try:
                    marker.open("x").close()
                except FileExistsError:
                    continue
                os.kill(os.getpid(), signal.SIGKILL)


def local_copy(state: Any) -> Any:
    """``state`` with each DTensor (FSDP2) replaced by this process's shard."""
    if isinstance(state, dict):
        return {key: local_copy(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(local_copy(value) for value in state)
    to_local = getattr(state, "to_local", None)
    return to_local().clone() if callable(to_local) else state


def main() -> None:
    """Train ``--epochs`` epochs, evaluate and save after each."""
    args = parser().parse_args()
    replica = int(os.environ["ACCEL_FT_REPLICA_ID"])
    life = int(os.environ.get("ACCEL_FT_GROUP_RESTART_COUNT", "0"))
    hold(args.hold, args.out, replica, life)
    set_seed(0)
    accelerator = Accelerator(
        gradient_accumulation_steps=args.accumulation,
        project_config=ProjectConfiguration(
            project_dir=str(args.out / "project"), automatic_checkpoint_naming=True
        ),
    )
    rank = accelerator.process_index
    killer = Killer(args.kill, args.out, replica, life, rank, args.kill_all_ranks)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
    train = DataLoader(Numbered(args.samples, 1), batch_size=args.batch_size, shuffle=True)
    evaluation = DataLoader(Numbered(40, 2), batch_size=8)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(
        model, optimizer, train, evaluation, scheduler
    )
    manager = accelerator.replica_training.manager
    average, should_commit = manager.average, manager.should_commit

    def averaging(tensors: list[torch.Tensor]) -> None:
        killer.point("allreduce")
        average(tensors)

    def voting() -> bool:
        committed = should_commit()
        if committed:
            killer.point("commit")
        return committed

    manager.average, manager.should_commit = averaging, voting  # type: ignore[method-assign]
    inner_step = optimizer.optimizer.step

    def stepping(*step_args: Any, **step_kwargs: Any) -> Any:
        killer.point("optimizer")
        return inner_step(*step_args, **step_kwargs)

    optimizer.optimizer.step = stepping  # type: ignore[method-assign]
    replicas = accelerator.replica_training
    healing_state, load_healing_state = replicas.healing_state, replicas.load_healing_state

    def sending() -> dict[str, Any]:
        killer.point("heal_source")
        return healing_state()

    def receiving(state: dict[str, Any]) -> None:
        killer.point("heal_target")
        load_healing_state(state)

    # torchft holds the functions given to it: wrap them where it keeps them.
    replicas.manager._manager._user_state_dicts["default"] = sending
    replicas.manager._manager._load_state_dict_fns["default"] = receiving
    accelerator.register_save_state_pre_hook(lambda models, weights, folder: killer.point("save"))

    starting_epoch = 0
    if args.resume:
        accelerator.load_state()
        starting_epoch = train.iteration
    steps = (args.out / f"steps-r{replica}-p{rank}.jsonl").open("a")
    evals = (args.out / f"evals-r{replica}-p{rank}.jsonl").open("a")
    for epoch in range(starting_epoch, args.epochs):
        model.train()
        step_first, step_count = -1, 0
        for inputs, targets, _ in train:
            with accelerator.accumulate(model):
                killer.point("forward")
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                killer.point("backward")
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            sample_epoch, first, count = train.batch_sampler.last_step_samples
            step_first = first if step_count == 0 else step_first
            step_count += count
            if not accelerator.sync_gradients:
                continue  # a micro-batch: the step goes on
            steps.write(
                json.dumps(
                    {
                        "life": life,
                        "pid": os.getpid(),
                        "epoch": sample_epoch,
                        "first": step_first,
                        "count": step_count,
                        "committed": not accelerator.optimizer_step_was_skipped,
                        "participants": manager.participants,
                        "time": time.time(),
                    }
                )
                + "\n"
            )
            steps.flush()
            step_count = 0
            killer.step += 1
            together = manager.participants == int(os.environ["ACCEL_FT_REPLICAS"])
            time.sleep(args.step_delay if together else args.solo_delay)
        model.eval()
        losses = []
        for inputs, targets, _ in evaluation:
            with torch.no_grad():
                losses.append(torch.nn.functional.mse_loss(model(inputs), targets).reshape(1))
        gathered = accelerator.gather_for_metrics(torch.cat(losses))
        evals.write(
            json.dumps({"epoch": epoch, "loss": gathered.mean().item(), "n": gathered.numel()})
            + "\n"
        )
        evals.flush()
        accelerator.save_state()
        if epoch == args.stop_after_epoch:
            break
    torch.save(
        local_copy(
            {
                "model": accelerator.unwrap_model(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "committed_steps": manager.committed_steps,
            }
        ),
        args.out / f"final-r{replica}-p{rank}.pt",
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
