"""Rank 1 raises after start-up while rank 0 waits in a barrier; the job must end promptly."""

from accel import Accelerator

accelerator = Accelerator()
if accelerator.process_index == 1:
    raise RuntimeError("rank 1 failed on purpose")
accelerator.wait_for_everyone()
