"""``accel merge-weights``: registered into the ``accel`` CLI through the ``accel.commands`` group.

Only argparse is imported at registration; torch and the merge code load when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register_merge_weights(subparsers: Any) -> None:
    """Add ``merge-weights CHECKPOINT_DIR OUTPUT_DIR`` to the ``accel`` command."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "merge-weights",
        help="Merge a sharded (FSDP) checkpoint into one set of safetensors files.",
        description="Merge the model shards of a save_state checkpoint into full weights, "
        "without starting processes.",
    )
    parser.add_argument("checkpoint_dir", help="Checkpoint folder written by save_state.")
    parser.add_argument("output_dir", help="Folder for model.safetensors (or shards + index).")
    parser.add_argument(
        "--max_shard_size", default="10GB", help="Largest weight file (e.g. 5GB); default 10GB."
    )
    parser.add_argument(
        "--unsafe_serialization",
        action="store_true",
        help="Write pytorch_model.bin (pickle) instead of safetensors.",
    )
    parser.set_defaults(handler=merge_weights_command)


def merge_weights_command(args: argparse.Namespace) -> int:
    """Run the merge; returns the exit code (1 with a one-line message on a bad checkpoint)."""
    from accel_ckpt.errors import AccelCkptError
    from accel_ckpt.merge_weights import merge_weights

    try:
        written = merge_weights(
            args.checkpoint_dir,
            args.output_dir,
            max_shard_size=args.max_shard_size,
            safe_serialization=not args.unsafe_serialization,
        )
    except AccelCkptError as error:
        print(f"accel merge-weights: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
