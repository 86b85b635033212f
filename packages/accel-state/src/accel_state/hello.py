"""A tiny distributed hello-world: ``torchrun --nproc_per_node 2 -m accel_state.hello``.

Each process reports its rank; the main process checks that everyone joined one group by summing
the ranks with an all-reduce, then prints a one-line summary.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from accel_state.partial_state import PartialState
from accel_state.shared import reset_state


def main() -> int:
    """Start the state, all-reduce the ranks, print the summary; return a process exit code."""
    state = PartialState()
    total = torch.tensor([float(state.process_index)], device=state.device)
    if state.use_distributed:
        dist.all_reduce(total)
    expected = state.num_processes * (state.num_processes - 1) / 2
    print(
        f"[rank {state.process_index}] {state.distributed_type.value} on {state.device}, "
        f"{state.num_processes} processes",
        flush=True,
    )
    state.wait_for_everyone()
    ok = float(total.item()) == expected
    state.print(
        f"hello from {state.num_processes} processes ({state.distributed_type.value}, backend "
        f"{state.backend}): rank sum {total.item():.0f} {'ok' if ok else 'WRONG'}"
    )
    reset_state()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
