"""What this machine has, found without importing torch (so the CLI starts fast)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def cpu_count() -> int:
    """CPU cores this process may run on (its affinity set where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def parse_gpu_ids(gpu_ids: str | None) -> list[str] | None:
    """``"0,1"`` -> ``["0", "1"]``; ``None``, ``""`` or ``"all"`` -> ``None`` (no restriction)."""
    if gpu_ids is None or gpu_ids.strip().lower() in ("", "all"):
        return None
    return [part.strip() for part in gpu_ids.split(",") if part.strip()]


def visible_gpu_count(environ: Mapping[str, str] | None = None, gpu_ids: str | None = None) -> int:
    """Number of CUDA GPUs workers would see.

    Order: ``gpu_ids``, then ``CUDA_VISIBLE_DEVICES``, then the NVIDIA driver's list under
    ``/proc``; if torch is already imported its own count is used instead of the driver's list.
    """
    chosen = parse_gpu_ids(gpu_ids)
    if chosen is not None:
        return len(chosen)
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [part for part in visible.split(",") if part.strip()]
        if entries and entries[0].strip() == "-1":
            return 0
        return len(entries)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        return int(torch.cuda.device_count())
    if _NVIDIA_GPUS.is_dir():
        return sum(1 for _ in _NVIDIA_GPUS.iterdir())
    return 0
