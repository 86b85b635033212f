"""Kill -9 a process in the middle of saving checkpoints, at many points (run as a script).

    python crash_driver.py OUT_DIR NUM_POINTS NUM_RANDOM_ROUNDS SEED

The driver imports everything, then forks one child per case (no torch work happens before the
forks). Every case starts from the same committed state A (``fixed`` and
``project/checkpoints/checkpoint_{0,1}``, total_limit=2), then saves state B over it and is
killed with SIGKILL:

* ``point_<k>``: right before the k-th file-system operation (write, fsync, mkdir, rename,
  renameat2, unlink, rmdir, rmtree) of the B saves, k spread over the whole run;
* ``random_<r>``: a child saving values 0, 1, 2, ... in a loop is killed after a random delay.

``OUT_DIR/results.json`` says what happened; the test then loads every case.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
import torch._dynamo

import accel_ckpt
from accel_ckpt import ProjectConfiguration, save_state

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_helpers import training_setup

OPERATIONS = [
    (os, "write"),
    (os, "fsync"),
    (os, "mkdir"),
    (os, "rename"),
    (os, "replace"),
    (os, "unlink"),
    (os, "rmdir"),
    (shutil, "rmtree"),
    (accel_ckpt.atomic, "_renameat2_exchange"),
]


def count_operations(kill_at: int | None) -> list[int]:
    """Patch the operations to count calls; SIGKILL this process at call number ``kill_at``."""
    count = [0]
    for module, name in OPERATIONS:
        original = getattr(module, name)

        def wrapper(*args, _original=original, **kwargs):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return _original(*args, **kwargs)

        setattr(module, name, wrapper)
    return count


def config(case: Path) -> ProjectConfiguration:
    return ProjectConfiguration(
        project_dir=str(case / "project"),
        automatic_checkpoint_naming=True,
        total_limit=2,
        iteration=2,
    )


def save_b(case: Path) -> None:
    setup = training_setup(2)
    save_state(case / "fixed", **setup)  # replaces state A
    save_state(project_config=config(case), **setup)  # checkpoint_2, then checkpoint_0 is removed


def dry_run(out: Path) -> None:
    """Commit state A into a template, then count the operations of the B saves."""
    torch.set_num_threads(1)
    template = out / "template"
    setup = training_setup(1)
    save_state(template / "fixed", **setup)
    project = ProjectConfiguration(
        project_dir=str(template / "project"), automatic_checkpoint_naming=True
    )
    save_state(project_config=project, **setup)
    save_state(project_config=project, **setup)
    shutil.copytree(template, out / "dry")
    count = count_operations(None)
    save_b(out / "dry")
    (out / "operations").write_text(str(count[0]))


def killed_case(out: Path, kill_at: int) -> None:
    torch.set_num_threads(1)
    case = out / f"point_{kill_at}"
    shutil.copytree(out / "template", case)
    count_operations(kill_at)
    save_b(case)


def loop_case(case: Path, report: int) -> None:
    torch.set_num_threads(1)
    setup = training_setup(3)
    project = ProjectConfiguration(
        project_dir=str(case / "project"), automatic_checkpoint_naming=True, total_limit=2
    )
    for value in range(10_000):
        with torch.no_grad():
            for model in setup["models"]:
                for parameter in model.parameters():
                    parameter.fill_(float(value))
        save_state(case / "fixed", **setup)
        save_state(project_config=project, **setup)
        os.write(report, f"{value}\n".encode())


def run_child(target, *args, timeout: float = 120.0) -> int:
    """Fork, run ``target(*args)`` in the child, return the child's wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            target(*args)
        finally:
            os._exit(0)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"child {target.__name__}{args[1:]} hung")
        time.sleep(0.01)


def random_round(out: Path, index: int, rng: random.Random) -> dict:
    case = out / f"random_{index}"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            loop_case(case, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    received = b""
    deadline = time.monotonic() + 60
    while b"\n" not in received and time.monotonic() < deadline:  # wait for a first commit
        if select.select([read_end], [], [], 0.1)[0]:
            received += os.read(read_end, 4096)
    delay = rng.uniform(0.0, 0.8)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    while chunk := os.read(read_end, 4096):
        received += chunk
    os.close(read_end)
    values = [int(line) for line in received.decode().split()]
    return {"case": case.name, "last_reported": values[-1] if values else None, "delay": delay}


def main() -> None:
    out = Path(sys.argv[1])
    points, rounds, seed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    status = run_child(dry_run, out)
    if status != 0:
        raise SystemExit(f"dry run failed with status {status}")
    total = int((out / "operations").read_text())
    chosen = sorted(
        {1, 2, total - 2, total - 1, total, *(1 + (i * total) // points for i in range(points))}
    )
    cases = []
    for kill_at in chosen:
        status = run_child(killed_case, out, kill_at)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        cases.append({"case": f"point_{kill_at}", "kill_at": kill_at, "killed": killed})
    randoms = [random_round(out, index, rng) for index in range(rounds)]
    (out / "results.json").write_text(
        json.dumps({"operations": total, "points": cases, "random": randoms}, indent=1)
    )


if __name__ == "__main__":
    main()
