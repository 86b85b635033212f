"""Fault tolerance across replica groups: step time on and off, the stall after a kill, healing.

Three 2-way data-parallel variants of one ~AdamW step on a 0.5 M-parameter MLP alternate round
by round (the order rotates), each a fresh ``accel launch`` of ``ft_job.py``:

* ``raw``: hand-written DDP, 2 processes (the baseline);
* ``accel``: the Accelerator, DDP, 2 processes;
* ``ft``: the Accelerator in 2 replica groups of 1 process (``--ft_replicas 2``): a quorum at
  the lighthouse, an all-reduce across groups and a commit vote per step.

Then one ``ft`` job whose group 1 is SIGKILLed mid-run: the survivor's longest step (the stall:
torchft's heartbeat timeout, 5 s by default, dominates) and the relaunched group's first quorum
(which heals it from the survivor: quorum plus copy of the model and AdamW state).

Run: ``python benchmarks/bench_ft.py [--rounds 5] [--steps 300]`` (needs ``accel[ft]``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
JOB = HERE / "ft_job.py"
WARMUP = 20
LAUNCH = {
    "raw": ["--num_processes", "2"],
    "accel": ["--num_processes", "2"],
    "ft": ["--ft_replicas", "2", "--num_processes", "1"],
}


def launch(mode: str, steps: int, out: Path, *extra: str) -> None:
    """One job of ``mode`` (hard limit 10 minutes)."""
    accel = str(Path(sys.executable).with_name("accel"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [
        accel,
        "launch",
        "--cpu",
        *LAUNCH[mode],
        *extra,
        str(JOB),
        mode,
        str(steps),
        str(out),
    ]
    subprocess.run(command, env=env, check=True, timeout=600, capture_output=True)


def median_step(out: Path, mode: str) -> float:
    record = json.loads((out / f"{mode}-0-0.json").read_text())
    return statistics.median(record["step_seconds"][WARMUP:])


def main() -> None:
    """Print the table of medians and the kill run's figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    modes = list(LAUNCH)
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="accel-bench-ft-") as folder:
        for number in range(args.rounds):
            order = modes[number % len(modes) :] + modes[: number % len(modes)]
            for mode in order:
                out = Path(folder) / f"round{number}-{mode}"
                out.mkdir()
                launch(mode, args.steps, out)
                seconds[mode].append(median_step(out, mode))
        kill = Path(folder) / "kill"
        kill.mkdir()
        launch("ft", args.steps, kill, "--max_restarts", "1")  # warm caches as the others
        kill_run = Path(folder) / "kill-run"
        kill_run.mkdir()
        command_steps = str(max(args.steps * 10, 3000))  # the survivor outlasts the relaunch
        accel = str(Path(sys.executable).with_name("accel"))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run(
            [accel, "launch", "--cpu", *LAUNCH["ft"], "--max_restarts", "1", str(JOB), "ft",
             command_steps, str(kill_run), "100"],
            env=env, check=True, timeout=600, capture_output=True,
        )  # fmt: skip
        survivor = json.loads((kill_run / "ft-0-0.json").read_text())
        relaunched = json.loads((kill_run / "ft-1-1.json").read_text())
    raw = statistics.median(seconds["raw"])
    print(f"## Replica groups vs DDP, 2-way data parallel, {args.rounds} rotating rounds of "
          f"{args.steps} steps, medians of each round's median step")  # fmt: skip
    print("| variant | seconds per step | / raw DDP |")
    print("| --- | --- | --- |")
    for mode in modes:
        value = statistics.median(seconds[mode])
        print(f"| {mode} | {value * 1000:.2f} ms | {value / raw:.2f} |")
    steady = statistics.median(survivor["step_seconds"][WARMUP:])
    print()
    print(f"Kill of group 1 at its step 100: the survivor's longest step {max(survivor['step_seconds']):.2f} s "
          f"(steady {steady * 1000:.1f} ms); the relaunched group's first quorum, healing "
          f"included, {relaunched['first_quorum_seconds'][0]:.2f} s.")  # fmt: skip


if __name__ == "__main__":
    main()
