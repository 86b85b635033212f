"""Costs that grow with the rank count, each beside its baseline, in one run.

Three parts, each a script of its own in ``benchmarks/`` (run one alone for its options):

- ``planning`` (``scale_planning.py``): ``torch.distributed.checkpoint`` save planning on the
  coordinator and load planning per rank, torch's default planners vs accel's, at simulated 8,
  64, 512 and 2,048 ranks of an FSDP2 state of 1,024 tensors (first and repeated save);
- ``reads`` (``scale_reads.py``): bytes read from checkpoint files summed over 8 processes
  (``/proc/<pid>/io`` ``rchar``) by ``load_state`` under DDP and FSDP2, every process reading
  vs accel's one read per checkpoint, against the checkpoint's size;
- ``memory`` (``scale_memory.py``): peak host memory summed over 4 ranks loading a 423 MB model
  through transformers' ``Trainer`` under FSDP2 with and without ``cpu_ram_efficient_loading``
  (and Hugging Face Accelerate's figures with ``--accelerate-python``). About 9 minutes a round.

Run: ``python benchmarks/bench_scale.py [--parts planning reads memory] [--quick]
[--accelerate-python PATH]``. ``--quick`` uses fewer ranks, a smaller checkpoint and skips
torch's quadratic planners past 512 ranks; the default is the full measurement.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("planning", "reads", "memory")


def part_command(part: str, quick: bool, accelerate_python: str | None) -> list[str]:
    """The command line of one part's script."""
    script = str(HERE / f"scale_{part}.py")
    if part == "planning":
        ranks = ["8", "64", "512"] if quick else ["8", "64", "512", "2048"]
        return [sys.executable, script, "--ranks", *ranks, "--repeats", "1" if quick else "3"]
    if part == "reads":
        size = "8" if quick else "32"
        return [sys.executable, script, "--size-mb", size, "--repeats", "1" if quick else "3"]
    command = [sys.executable, script, "--repeats", "1"]
    if quick:
        command += ["--hidden", "256", "--layers", "2"]
    if accelerate_python:
        command += ["--accelerate-python", accelerate_python]
    return command


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen parts one after the other and print their tables under headings."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--accelerate-python", default=None)
    args = parser.parse_args(argv)
    failed = []
    for part in args.parts:
        command = part_command(part, args.quick, args.accelerate_python)
        print(
            f"### {part}\n\n```\n$ {' '.join(Path(c).name if c == sys.executable else c for c in command)}",
            flush=True,
        )
        result = subprocess.run(command, check=False, cwd=HERE.parent)
        print("```\n", flush=True)
        if result.returncode != 0:
            failed.append(f"{part} (exit {result.returncode})")
    if failed:
        print(f"failed parts: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
