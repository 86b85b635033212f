"""For the XLA leg: the launcher calls main() in every process."""

import sys


def main():
    import torch_xla.runtime as xr

    print(
        f"xla worker ordinal {xr.global_ordinal()} of {xr.world_size()} argv {sys.argv[1:]}",
        flush=True,
    )
