"""Every way a script ends its process group, repeated on 2 real processes that really exit.

    python group_endings_script.py REPEATS ENDING [ENDING ...]

The driver imports torch and accel once, then for each ending and repetition forks two ranks (a fresh port
each time). A rank prepares DDP models in a function, trains two steps, ends the group the
ENDING way, lets the function return (freeing the wrappers) and leaves the interpreter the normal
way: atexit hooks, module teardown and all. Forking after the imports, with the driver's objects
frozen out of the garbage collector's reach (``gc.freeze()``), makes a repetition cost about half
a second instead of two interpreter start-ups.

A rank that has not exited after ``HANG_SECONDS`` is hung: the driver has it dump its threads'
stacks (faulthandler, which needs no GIL), kills it and goes on with the next ending. A rank that
exits non-zero (an abort at shutdown is -6) fails its ending too. Each ending's last line says how
many repetitions ended cleanly; the exit code is 1 when any ending failed.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import time
from typing import Any

import torch

import accel
import accel_state
from accel_state.testing.pool import pool_environment
from accel_state.testing.ports import find_free_port

#: A deadline for hangs, not for speed: a repetition takes about a second on 2 busy cores.
HANG_SECONDS = float(os.environ.get("GROUP_ENDINGS_HANG_SECONDS", "120"))
WORLD_SIZE = 2

ENDINGS = (
    "partial_state",  # PartialState().destroy_process_group()
    "accelerator_state",  # accelerator.state.destroy_process_group()
    "torch",  # torch.distributed.destroy_process_group(), called by the script itself
    "end_training",  # accelerator.end_training()
    "reset_then_new",  # accel_state.reset_state() (stops the group), then a new Accelerator
    "exit",  # no ending at all: the interpreter exits with the wrappers alive
)


def prepare_and_train(accelerator: Any) -> tuple[Any, Any]:
    """Two DDP models prepared and trained two steps; the last collective ends just before."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    first, second, optimizer = accelerator.prepare(first, second, optimizer)
    for _ in range(2):
        loss = second(first(torch.randn(4, 8))).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return first, second


def end_in_a_function(ending: str) -> None:
    """Prepare, train, end the group the ``ending`` way and return (the wrappers are freed)."""
    accelerator = accel.Accelerator(cpu=True)
    models = prepare_and_train(accelerator)
    if ending == "partial_state":
        accel.PartialState().destroy_process_group()
    elif ending == "accelerator_state":
        accelerator.state.destroy_process_group()
    elif ending == "torch":
        torch.distributed.destroy_process_group()
    elif ending == "end_training":
        accelerator.end_training()
    elif ending == "reset_then_new":
        accel_state.reset_state()
    else:
        raise ValueError(f"ending={ending!r} is not one of {ENDINGS}")
    del models


def run_rank(ending: str, rank: int, port: int) -> None:
    """One rank of one repetition; it returns to leave the interpreter the normal way."""
    os.environ.update(pool_environment(rank, WORLD_SIZE, port, use_cpu=True))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if ending == "exit":
        accelerator = accel.Accelerator(cpu=True)
        # Module globals: alive until the interpreter tears the module down.
        globals()["live_models"] = prepare_and_train(accelerator)
        return
    end_in_a_function(ending)
    if ending == "reset_then_new":
        accelerator = accel.Accelerator(cpu=True)  # a new group, the old wrappers already freed
        prepare_and_train(accelerator)
        accelerator.state.destroy_process_group()


def wait_for(pids: list[int], deadline: float) -> tuple[dict[int, int], list[int]]:
    """Each exited rank's exit code, and the ranks still running at ``deadline``."""
    codes: dict[int, int] = {}
    while True:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        running = [pid for pid in pids if pid not in codes]
        if not running or time.monotonic() > deadline:
            return codes, running
        time.sleep(0.02)


def stop_hung(pids: list[int]) -> None:
    """Have every hung rank print its stacks, then kill it."""
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    time.sleep(2.0)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def warm_up() -> None:
    """Import, in the driver, what the ranks would import (a one-process run, no group).

    Then freeze what the driver holds: a forked rank's collector and its teardown would
    otherwise walk every inherited object, copying each page they touch (about a second of a
    rank's exit, three times what freezing leaves). The ranks' own objects (their groups,
    wrappers and the tensors of the last collective) are made after the fork and stay collected
    as in any script.
    """
    import torch._dynamo  # DDP.forward imports it
    import torch.nn.parallel  # noqa: F401

    prepare_and_train(accel.Accelerator(cpu=True))
    accel_state.reset_state()
    gc.collect()
    gc.freeze()


def run_ending(ending: str, repeats: int) -> tuple[str, int, int] | bool:
    """Fork the ranks of every repetition of ``ending``: in a rank, what it must run; in the
    driver, whether every repetition ended cleanly."""
    for repetition in range(1, repeats + 1):
        port = find_free_port()
        pids = []
        for rank in range(WORLD_SIZE):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                return ending, rank, port
            pids.append(pid)
        codes, running = wait_for(pids, time.monotonic() + HANG_SECONDS)
        if running:
            stop_hung(running)
            print(f"{ending}: repetition {repetition} HUNG; stacks above", flush=True)
            return False
        if any(codes.values()):
            print(f"{ending}: repetition {repetition} exit codes {sorted(codes.values())}")
            return False
    print(f"{ending}: {repeats} of {repeats} repetitions ended cleanly", flush=True)
    return True


def drive(repeats: int, endings: list[str]) -> tuple[str, int, int] | None:
    """Run every ending; in a rank, return what it must run (the driver exits)."""
    warm_up()
    clean = True
    for ending in endings:
        outcome = run_ending(ending, repeats)
        if isinstance(outcome, tuple):
            return outcome
        clean = clean and outcome
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    unknown = [ending for ending in sys.argv[2:] if ending not in ENDINGS]
    if len(sys.argv) < 3 or unknown:
        sys.exit(f"usage: {sys.argv[0]} REPEATS {{{','.join(ENDINGS)}}} ...")
    run_rank(*drive(int(sys.argv[1]), sys.argv[2:]))
