"""Run in a fresh process: load a model bigger than its CPU budget, run it, report memory.

Usage: ``python big_model_rss_child.py CHECKPOINT REFERENCE OFFLOAD_DIR WIDTH DEPTH BUDGET``.
Prints one JSON line: RSS growth of a multi-GB ``init_empty_weights`` model, the peak RSS
growth while loading and running (``VmHWM`` after resetting it), and whether outputs matched.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import psutil
import torch
from big_model_helpers import Stack

from accel_ckpt import init_empty_weights, load_checkpoint_and_dispatch


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux); False when unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident bytes since the last reset (VmHWM), else since start (ru_maxrss)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    checkpoint, reference, offload, width, depth, budget = sys.argv[1:7]
    torch.set_num_threads(1)
    process = psutil.Process()
    saved = torch.load(reference)
    with init_empty_weights():  # warm-up: torch 2.9 loads ~40 MB the first time (not weights)
        Stack(64, 1, 128)
    before = process.memory_info().rss
    with init_empty_weights():
        huge = Stack(8192, 4, 16384)  # 4 GiB of float32 weights
    huge_bytes = sum(p.numel() * p.element_size() for p in huge.parameters())
    empty_growth = process.memory_info().rss - before
    del huge
    with init_empty_weights():
        model = Stack(int(width), int(depth), 2 * int(width))
    baseline = process.memory_info().rss
    resettable = reset_peak()
    model = load_checkpoint_and_dispatch(
        model,
        checkpoint,
        device_map="auto",
        max_memory={"cpu": int(budget)},
        no_split_module_classes=["Block"],
        offload_folder=offload,
    )
    with torch.no_grad():
        output = model(saved["input"])
    peak = peak_rss() - baseline
    print(
        json.dumps(
            {
                "huge_bytes": huge_bytes,
                "empty_growth": empty_growth,
                "peak_growth": peak,
                "peak_reset": resettable,
                "device_map": {k: str(v) for k, v in model.hf_device_map.items()},
                "max_abs_diff": float((output - saved["output"]).abs().max()),
            }
        )
    )


if __name__ == "__main__":
    main()
