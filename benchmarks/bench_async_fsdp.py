"""Asynchronous sharded saves under FSDP2: how long the training loop is blocked, 2 gloo processes.

An FSDP2 model (``bench_fsdp.Model``, ``--dim 1024``: 589 MiB of weights and AdamW state over both
processes) trains on the CPU. Alternating rounds (A B A B, after one warm-up round of each):

* A: ``Accelerator.save_state(folder)`` (synchronous: staged, written through
  ``torch.distributed.checkpoint``, fsynced, published);
* B: ``save_state(folder, blocking=False)``: the time until it returns (the loop is blocked for
  that), then training steps while the background write runs, until the handle is done, then
  ``wait()``;
* C: for comparison, raw ``torch.distributed.checkpoint.async_save`` of the model and optimizer
  state (``get_state_dict``) on a gloo group of its own, as torchtitan saves: the time until it
  returns, then training steps until its future is done. It writes only the tensors (no RNG,
  dataloader or scheduler state, no fsync, no atomic publish), so it is a lower bound for B.

Reported (medians over rounds, the slower rank of each round): blocked time of B over the
synchronous save (target <= 0.2), time until B is committed, and the step time of steps that
overlap a background write versus steps with no save in flight (``--steps`` of them per round),
and the same blocked and committed times for C.

Run: ``python benchmarks/bench_async_fsdp.py [--rounds 3] [--dim 1024] [--steps 3] [--folder DIR]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
from bench_fsdp import accel_prepared, batches, loss_of, state_bytes

from accel_state.testing import spawn_workers


def dcp_async_save(model: Any, optimizer: Any, folder: str, group: Any) -> Any:
    """Raw ``torch.distributed.checkpoint.async_save`` of the sharded model and optimizer state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, getattr(optimizer, "optimizer", optimizer))
    state = {"model": model_state, "optimizer": optimizer_state}
    return dcp.async_save(state, checkpoint_id=folder, process_group=group)


def worker(rounds: int, dim: int, steps: int, folder: str) -> dict[str, Any]:
    """Every rank: timings per round (the first round of each kind is a warm-up)."""
    accelerator, model, optimizer = accel_prepared(dim)
    data = batches(8, accelerator.process_index)
    position = 0

    def step() -> float:
        nonlocal position
        start = time.perf_counter()
        loss = loss_of(model, data[position % len(data)])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        position += 1
        return time.perf_counter() - start

    step()  # optimizer state exists from here on
    result: dict[str, Any] = {
        "bytes": state_bytes(model, optimizer),
        "sync": [],
        "blocked": [],
        "committed": [],
        "quiet_steps": [],
        "overlap_steps": [],
        "dcp_blocked": [],
        "dcp_committed": [],
    }
    dcp_group = torch.distributed.new_group(backend="gloo")
    for round_index in range(rounds + 1):
        for kind in ("sync", "async", "dcp"):
            quiet = [step() for _ in range(steps)]
            accelerator.wait_for_everyone()
            start = time.perf_counter()
            if kind == "sync":
                accelerator.save_state(f"{folder}/sync")
                result["sync"].append(time.perf_counter() - start)
                continue
            if kind == "dcp":
                future = dcp_async_save(model, optimizer, f"{folder}/dcp-{round_index}", dcp_group)
                blocked = time.perf_counter() - start
                while not future.done():
                    step()
                future.result()
                if round_index > 0:
                    result["dcp_blocked"].append(blocked)
                    result["dcp_committed"].append(time.perf_counter() - start)
                accelerator.wait_for_everyone()
                continue
            handle = accelerator.save_state(f"{folder}/async", blocking=False)
            blocked = time.perf_counter() - start
            overlapped = []
            while not handle.done():
                overlapped.append(step())
            handle.wait()
            committed = time.perf_counter() - start
            if round_index > 0:
                result["blocked"].append(blocked)
                result["committed"].append(committed)
                result["quiet_steps"].extend(quiet)
                result["overlap_steps"].extend(overlapped)
            # Both ranks must run the same number of steps: pad to the larger count.
            counts = accelerator.gather(torch.tensor([len(overlapped)])).tolist()
            for _ in range(max(counts) - len(overlapped)):
                extra = step()
                if round_index > 0:
                    result["overlap_steps"].append(extra)
    result["sync"] = result["sync"][1:]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="accel-bench-async-", dir=args.folder)
    started = time.perf_counter()
    try:
        ranks = spawn_workers(
            worker, 2, args=(args.rounds, args.dim, args.steps, folder), timeout=1800
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    slowest = {
        key: [max(r[key][i] for r in ranks) for i in range(args.rounds)]
        for key in ("sync", "blocked", "committed", "dcp_blocked", "dcp_committed")
    }
    state_mib = sum(r["bytes"] for r in ranks) / 2**20
    sync, blocked = statistics.median(slowest["sync"]), statistics.median(slowest["blocked"])
    quiet = statistics.median(ranks[0]["quiet_steps"])
    overlap = statistics.median(ranks[0]["overlap_steps"]) if ranks[0]["overlap_steps"] else 0.0
    load = os.getloadavg()[0]
    print(f"FSDP2, 2 gloo processes, state {state_mib:.0f} MiB, folder {folder}")
    print(f"{args.rounds} alternating rounds after a warm-up; load average {load:.1f}")
    print("                                   median s   all rounds (s, slower rank)")
    for label, key in (
        ("save_state (sync)", "sync"),
        ("save_state(blocking=False) block", "blocked"),
        ("  ... until committed", "committed"),
        ("raw dcp.async_save block", "dcp_blocked"),
        ("  ... until its future is done", "dcp_committed"),
    ):
        values = ", ".join(f"{v:.2f}" for v in slowest[key])
        print(f"{label:34s} {statistics.median(slowest[key]):8.3f}   {values}")
    print(f"step, no save in flight (rank 0)   {quiet:8.3f}   n={len(ranks[0]['quiet_steps'])}")
    print(f"step, overlapping the write        {overlap:8.3f}   n={len(ranks[0]['overlap_steps'])}")
    ratio = blocked / sync
    verdict = "OK" if ratio <= 0.2 else "MISSED"
    print(f"async block / sync save  {ratio:.2f}  (target <= 0.2)  {verdict}")
    print(f"overlapped / quiet step  {overlap / quiet:.2f}")
    dcp_ratio = statistics.median(slowest["dcp_blocked"]) / sync
    print(f"raw dcp.async_save block / sync save  {dcp_ratio:.2f}  (lower bound: tensors only)")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
