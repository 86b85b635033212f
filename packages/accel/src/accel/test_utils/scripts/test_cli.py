"""The smallest launch target: prints the accelerators this process sees (``accel launch`` smoke test)."""

from __future__ import annotations

import torch

from accel.utils import is_xpu_available


def main() -> None:
    """Print how many GPUs (or XPUs) this process sees."""
    kind, count = "GPU", 0
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
    elif is_xpu_available():
        kind, count = "XPU", torch.xpu.device_count()
    print(f"Successfully ran on {count} {kind}s")


if __name__ == "__main__":
    main()
