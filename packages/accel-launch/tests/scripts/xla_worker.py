"""For the XLA leg: the launcher calls main() in every process; it reports its place in the job."""

import sys


def main():
    import torch_xla.runtime as xr

    from accel_state import PartialState

    state = PartialState()
    state.wait_for_everyone()
    print(
        f"xla worker ordinal {xr.global_ordinal()} of {xr.world_size()} argv {sys.argv[1:]} "
        f"state {state.distributed_type.value} {state.process_index}/{state.num_processes} "
        f"{state.device.type}",
        flush=True,
    )
