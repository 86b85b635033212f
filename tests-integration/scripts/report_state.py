"""Print what the Accelerator sees: process count, distributed type, precision, accumulation."""

import sys

import torch

from accel import Accelerator

accelerator = Accelerator()
total = accelerator.reduce(torch.tensor([float(accelerator.process_index)]), reduction="sum")
# One write per line: print() writes the text and the newline separately, so lines of
# concurrent processes could interleave.
sys.stdout.write(
    f"STATE rank={accelerator.process_index} num={accelerator.num_processes} "
    f"type={accelerator.distributed_type.value} precision={accelerator.mixed_precision} "
    f"accumulation={accelerator.gradient_accumulation_steps} sum={total.item():.0f}\n"
)
sys.stdout.flush()
accelerator.end_training()
