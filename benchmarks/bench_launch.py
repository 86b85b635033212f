"""Launcher overhead of ``accel-launch`` against ``torchrun``, and CLI start-up times.

Both launch the same 2-process hello world (``-m accel_state.hello``); the start-up commands are the
ones that must not import torch.

Runs are alternated (accel, torchrun, accel, torchrun...) so that load from other processes hits
both sides alike; medians are reported. Usage: ``python benchmarks/bench_launch.py [--pairs N]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELLO = ["-m", "accel_state.hello"]


def executable(name: str) -> str:
    """The console script installed beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed (pip install -e packages/accel-launch)")
    return found


def timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds ``command`` took; fails loudly if it did not succeed."""
    start = time.perf_counter()
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(
            f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--pairs", type=int, default=5, help="alternated accel/torchrun pairs (>= 5)"
    )
    parser.add_argument("--cli-runs", type=int, default=7, help="runs of each start-up command")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    accel_launch = [executable("accel-launch"), "--cpu", "--num_processes", "2", *HELLO]
    torchrun = [executable("torchrun"), "--nproc_per_node", "2", *HELLO]
    accel = executable("accel")

    timed(accel_launch, env)  # warm the page cache for both sides
    timed(torchrun, env)
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(max(5, args.pairs)):
        ours.append(timed(accel_launch, env))
        theirs.append(timed(torchrun, env))

    startup: dict[str, list[float]] = {
        "accel --help": [],
        "accel config default": [],
        "accel launch --help": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.cli_runs):
            startup["accel --help"].append(timed([accel, "--help"], env))
            target = str(Path(folder) / f"config_{index}.yaml")
            startup["accel config default"].append(
                timed([accel, "config", "default", "--config_file", target], env)
            )
            startup["accel launch --help"].append(timed([accel, "launch", "--help"], env))

    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    rows = [
        ("accel-launch --cpu --num_processes 2 hello", f"{ours_median:.3f}", len(ours), ""),
        ("torchrun --nproc_per_node 2 hello", f"{theirs_median:.3f}", len(theirs), ""),
        ("ratio accel-launch / torchrun", f"{ours_median / theirs_median:.3f}", "", "<= 1.05"),
    ]
    rows += [
        (name, f"{statistics.median(times):.3f}", len(times), "<= 0.300")
        for name, times in startup.items()
    ]
    print(f"{'measurement':<44} {'median s':>9} {'runs':>5}  target")
    print("-" * 70)
    for name, value, runs, target in rows:
        print(f"{name:<44} {value:>9} {runs!s:>5}  {target}")
    print(f"\naccel-launch runs: {', '.join(f'{t:.2f}' for t in ours)}")
    print(f"torchrun runs:     {', '.join(f'{t:.2f}' for t in theirs)}")


if __name__ == "__main__":
    main()
