"""Checkpoint throughput of accel_ckpt against the disk's own speed, measured in the same run.

A model plus its AdamW state (``--size-mb`` in total, default 1024) is saved with
``save_state`` (files fsynced, manifest, atomic rename) and loaded back with ``load_state``
(sizes and CRC-32 checked) from a cold page cache. References, alternated with them:
``dd if=/dev/zero bs=16M count=N conv=fdatasync`` of the same size, and a cold ``dd`` read of the
checkpoint's files. Also the time ``save_state(blocking=False)`` blocks the caller versus a synchronous save.
Medians of ``--repeats`` rounds after one warm-up round. Targets: save >= 0.8x dd write, load >= 0.8x cold read,
asynchronous blocking <= 0.2x synchronous save.

Run: ``python benchmarks/bench_ckpt.py [--size-mb 1024] [--repeats 5] [--dir /tmp]``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.optim import Optimizer

from accel_ckpt import load_state, release_staging_memory, save_state

MB = 1024 * 1024
BLOCK = 16 * MB
READ_SETTLE_S = 2.0


def build(total_bytes: int) -> tuple[nn.Sequential, Optimizer]:
    """A stack of 2048x2048 linear layers whose weights + AdamW moments add up to total_bytes."""
    layer_bytes = 2048 * 2048 * 4
    layers = max(1, round(total_bytes / 3 / layer_bytes))
    model = nn.Sequential(*(nn.Linear(2048, 2048, bias=False) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def state_bytes(model: nn.Module, optimizer: Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
    return total


def drop_cache(paths: list[Path], method: str) -> None:
    """Evict files from the page cache (all caches with --drop-caches proc)."""
    if method == "proc":  # every cache of the machine: other users feel it
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_in(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def settle(seconds: float = 0.3) -> None:
    """Let writeback and the previous step's deletes finish before the next measurement.

    On virtual disks, blocks written moments ago read back several times slower than the same
    blocks a few seconds later (the host is still flushing them); reads therefore wait longer.
    """
    os.sync()
    time.sleep(seconds)


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def dd_write(path: Path, count: int) -> float:
    command = ["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fdatasync"]
    return timed(lambda: subprocess.run(command, check=True, capture_output=True))


def dd_read(paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        command = ["dd", f"if={path}", "of=/dev/null", "bs=16M"]
        subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def one_round(
    root: Path, index: int, model: nn.Module, optimizer: Optimizer, count: int, method: str
) -> dict[str, float]:
    """One of each measurement; references and accel_ckpt swap order every other round.

    The cold-read reference reads the checkpoint's own files: on virtual disks, blocks written
    moments ago read back slower than older ones, so reading other data would not be fair. Both
    timed reads start with this machine's page cache dropped for those files; an untimed read
    before them leaves the host's cache (outside our control) in the same state for both.
    """
    times: dict[str, float] = {}
    dd_file, ckpt, background = root / "dd.bin", root / f"ckpt_{index}", root / f"async_{index}"

    def save() -> None:
        times["save"] = timed(lambda: save_state(ckpt, models=[model], optimizers=[optimizer]))

    def write() -> None:
        times["dd"] = dd_write(dd_file, count)

    def load() -> None:
        drop_cache(files_in(ckpt), method)
        settle()
        times["load"] = timed(lambda: load_state(ckpt, models=[model], optimizers=[optimizer]))

    def read() -> None:
        drop_cache(files_in(ckpt), method)
        settle()
        times["read"] = dd_read(sorted(files_in(ckpt)))

    first, second = (write, save) if index % 2 == 0 else (save, write)
    for step in (first, second):
        settle()
        step()
    settle(READ_SETTLE_S)
    dd_read(sorted(files_in(ckpt)))  # primes a virtual disk's host cache equally for both reads
    for step in (read, load) if index % 2 == 0 else (load, read):
        step()
    settle()
    start = time.perf_counter()
    handle = save_state(background, models=[model], optimizers=[optimizer], blocking=False)
    times["block"] = time.perf_counter() - start
    handle.wait()
    times["async"] = time.perf_counter() - start
    dd_file.unlink()
    shutil.rmtree(ckpt)
    shutil.rmtree(background)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="model + AdamW state size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    parser.add_argument(
        "--drop-caches",
        choices=["fadvise", "proc"],
        default="fadvise",
        help="evict only the files read (default) or every cache on the machine (needs root)",
    )
    args = parser.parse_args()
    model, optimizer = build(args.size_mb * MB)
    nbytes = state_bytes(model, optimizer)
    count = math.ceil(nbytes / BLOCK)
    root = Path(tempfile.mkdtemp(prefix="accel-bench-", dir=args.dir))
    print(
        f"state: {nbytes / MB:.0f} MiB ({len(model)} layers + AdamW); dd: {count} x 16 MiB; "
        f"cache eviction: {args.drop_caches}; folder: {root}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    results: dict[str, list[float]] = {}
    try:
        for index in range(args.repeats):
            for key, value in one_round(
                root, index, model, optimizer, count, args.drop_caches
            ).items():
                results.setdefault(key, []).append(value)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        release_staging_memory()

    median = {k: statistics.median(v) for k, v in results.items()}
    gbps = {k: nbytes / median[k] / 1e9 for k in ("dd", "save", "read", "load")}
    print(f"{'':28}{'median s':>10}{'GB/s':>8}   all rounds (s)")
    labels = {
        "dd": "dd write+fdatasync",
        "save": "save_state (sync)",
        "read": "dd cold read (same files)",
        "load": "load_state (cold)",
        "block": "save_state async: block",
        "async": "  ... until committed",
    }
    for key, label in labels.items():
        rate = f"{gbps[key]:8.2f}" if key in gbps else " " * 8
        rounds = ", ".join(f"{v:.2f}" for v in results[key])
        print(f"{label:28}{median[key]:10.3f}{rate}   {rounds}")
    checks = [
        ("save / dd write", gbps["save"] / gbps["dd"], 0.8, ">="),
        ("load / cold read", gbps["load"] / gbps["read"], 0.8, ">="),
        ("async block / sync save", median["block"] / median["save"], 0.2, "<="),
    ]
    for name, ratio, target, sense in checks:
        ok = ratio >= target if sense == ">=" else ratio <= target
        print(f"{name:24} {ratio:5.2f}  (target {sense} {target})  {'OK' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
