"""Run in a fresh process: load a sharded fp32 checkpoint quantized to 8 bits, report memory.

Usage: ``python quantized_rss_child.py CHECKPOINT WIDTH DEPTH``. Prints one JSON line: the
fp32 size of the model, the peak RSS growth while ``load_and_quantize_model`` ran (``VmHWM``
after resetting it) and the bytes of the quantized parameters.
"""

from __future__ import annotations

import json
import sys

import psutil
import torch
from big_model_helpers import Stack
from big_model_rss_child import peak_rss, reset_peak

from accel_ckpt import init_empty_weights
from accel_ckpt.big_modeling import BnbQuantizationConfig, load_and_quantize_model


def main() -> None:
    checkpoint, width, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    import bitsandbytes  # noqa: F401 - imported before the baseline: its import is not the load

    process = psutil.Process()
    with init_empty_weights():
        model = Stack(width, depth, 2 * width)
    fp32_bytes = sum(p.numel() * 4 for p in model.parameters())
    config = BnbQuantizationConfig(load_in_8bit=True, skip_modules=[])
    baseline = process.memory_info().rss
    resettable = reset_peak()
    model = load_and_quantize_model(model, config, checkpoint)
    peak = peak_rss() - baseline
    quantized = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        json.dumps(
            {
                "fp32_bytes": fp32_bytes,
                "peak_growth": peak,
                "peak_reset": resettable,
                "quantized_bytes": quantized,
            }
        )
    )


if __name__ == "__main__":
    main()
