"""Bytes read from checkpoint files by a whole job when it loads a checkpoint, before and after.

Eight processes (``--world``) over gloo on the CPU load a checkpoint of about ``--size-mb`` MB
(a stack of linear layers plus its AdamW moments) through ``Accelerator.load_state``:

* ``ddp``: a replicated (DDP) checkpoint. Baseline: the previous path, every process reading
  every file itself (``accel_ckpt.training_state._shared_reads`` patched to return ``None``
  inside this benchmark only). Shared: the current path, process 0 reads, the others receive.
* ``fsdp2_full``: FSDP2 ``FULL_STATE_DICT``. Baseline: every process reads ``model.safetensors``
  and ``optimizer.pt`` (``SharedReads.current`` patched to ``None``); shared: the current path.
* ``fsdp2_sharded``: FSDP2 ``SHARDED_STATE_DICT`` (torch.distributed.checkpoint); each process
  reads its own slices, the same code in both columns, listed for scale.

Measure: the sum over processes of the ``rchar`` delta of ``/proc/self/io`` around the load.
``rchar`` counts bytes passed to ``read()``-family calls, whatever the page cache holds, so a
warm cache does not hide reads (``read_bytes`` counts only page-cache misses). Every path
measured reads with ordinary reads: accel-ckpt's safetensors reader uses ``readinto``, torch.load
and DCP read through file objects; none of them maps the files (a memory map's page faults
would not appear in ``rchar``; the old FSDP full-state path used ``safetensors.load_file``,
which maps, so its baseline here reads the same files with ordinary reads instead). Gloo moves
the broadcast bytes with ``recv``, which ``rchar`` does not count; the manifest and per-process
RNG files are still read by every process and are included. Timings are medians of
``--repeats`` alternating rounds; on a 2-core machine with 8 processes they mostly show CPU
contention, the byte counts are the result.

Run: ``python benchmarks/scale_reads.py [--world 8] [--size-mb 32] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from accel_state.testing import spawn_workers

MB = 1024 * 1024
WIDTH = 512


def rchar() -> int:
    """Bytes this process passed to read()-family system calls so far."""
    with open("/proc/self/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


class Block(torch.nn.Module):
    """One linear layer (the FSDP wrapping unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer."""
        return torch.relu(self.linear(x))


def build(size_mb: int) -> torch.nn.Sequential:
    """Layers whose weights plus AdamW's two moments add up to about ``size_mb`` MB."""
    layers = max(1, round(size_mb * MB / 3 / (WIDTH * WIDTH * 4)))
    torch.manual_seed(0)
    return torch.nn.Sequential(*(Block() for _ in range(layers)))


def accelerator_for(mode: str, folder: str) -> Any:
    """A fresh Accelerator for ``mode`` saving under ``folder``."""
    from accel import Accelerator, FullyShardedDataParallelPlugin
    from accel_ckpt import ProjectConfiguration
    from accel_state import reset_state

    reset_state(stop_process_group=False)
    config = ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True)
    if mode == "ddp":
        return Accelerator(project_config=config)
    state_dict_type = "FULL_STATE_DICT" if mode == "fsdp2_full" else "SHARDED_STATE_DICT"
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        state_dict_type=state_dict_type,
    )
    return Accelerator(project_config=config, fsdp_plugin=plugin)


@contextlib.contextmanager
def per_process_reads(mode: str) -> Iterator[None]:
    """The previous path: every process reads every file (patched here, for the baseline)."""
    from accel_ckpt import shared_read, training_state

    saved = training_state._shared_reads, shared_read.SharedReads.current
    training_state._shared_reads = lambda folder: None  # type: ignore[assignment]
    shared_read.SharedReads.current = classmethod(lambda cls, *a, **k: None)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        training_state._shared_reads = saved[0]  # type: ignore[assignment]
        shared_read.SharedReads.current = saved[1]  # type: ignore[method-assign]


def load_worker(mode: str, size_mb: int, repeats: int, folder: str) -> dict[str, Any]:
    """One process: save once, then load alternately with the baseline and the shared path."""
    accelerator = accelerator_for(mode, folder)
    model = build(size_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(4, WIDTH)).sum().backward()
    optimizer.step()
    saved = accelerator.save_state()
    total = sum(p.stat().st_size for p in Path(saved).rglob("*") if p.is_file())
    reads: dict[str, list[int]] = {"baseline": [], "shared": []}
    seconds: dict[str, list[float]] = {"baseline": [], "shared": []}
    accelerator.load_state(saved)  # warm-up: imports, first-use paths
    for round_index in range(repeats):
        order = ("baseline", "shared") if round_index % 2 == 0 else ("shared", "baseline")
        for variant in order:
            patch = per_process_reads(mode) if variant == "baseline" else contextlib.nullcontext()
            with patch:
                accelerator.wait_for_everyone()
                before, start = rchar(), time.perf_counter()
                accelerator.load_state(saved)
                seconds[variant].append(time.perf_counter() - start)
                reads[variant].append(rchar() - before)
    return {"total": total, "reads": reads, "seconds": seconds}


def measure(
    world: int = 8, size_mb: int = 32, repeats: int = 3, modes: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """One row per mode: checkpoint size and bytes read by the whole job, baseline and shared."""
    rows = []
    for mode in modes or ("ddp", "fsdp2_full", "fsdp2_sharded"):
        with tempfile.TemporaryDirectory(prefix="scale-reads-") as folder:
            results = spawn_workers(
                load_worker, world, args=(mode, size_mb, repeats, folder), timeout=1200, reuse=False
            )
        total = results[0]["total"]
        row: dict[str, Any] = {"mode": mode, "world": world, "checkpoint_mb": total / MB}
        for variant in ("baseline", "shared"):
            per_round = [sum(out["reads"][variant][i] for out in results) for i in range(repeats)]
            read = statistics.median(per_round)
            row[f"{variant}_read_mb"] = read / MB
            row[f"{variant}_x_checkpoint"] = read / total
            row[f"{variant}_rank0_mb"] = statistics.median(results[0]["reads"][variant]) / MB
            row[f"{variant}_seconds"] = statistics.median(
                max(out["seconds"][variant][i] for out in results) for i in range(repeats)
            )
        row["read_ratio"] = row["shared_read_mb"] / row["baseline_read_mb"]
        rows.append(row)
    return rows


def main() -> None:
    """Print the rows as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--size-mb", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="*", default=[])
    args = parser.parse_args()
    rows = measure(args.world, args.size_mb, args.repeats, tuple(args.modes))
    header = (
        f"{'mode':<14} {'ckpt MB':>8} {'before MB':>10} {'x ckpt':>7} {'after MB':>9} "
        f"{'x ckpt':>7} {'after/before':>12} {'before s':>9} {'after s':>8}"
    )
    print(f"{args.world} processes, bytes read from checkpoint files summed over processes (rchar)")
    print(header)
    for row in rows:
        print(
            f"{row['mode']:<14} {row['checkpoint_mb']:>8.1f} {row['baseline_read_mb']:>10.1f} "
            f"{row['baseline_x_checkpoint']:>7.2f} {row['shared_read_mb']:>9.1f} "
            f"{row['shared_x_checkpoint']:>7.2f} {row['read_ratio']:>12.3f} "
            f"{row['baseline_seconds']:>9.2f} {row['shared_seconds']:>8.2f}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
