"""Accelerate's ``accelerate.commands.merge`` module path: the merge-weights parser and command.

``accel merge-weights`` itself is accel-ckpt's subcommand; this module gives scripts that build
Accelerate's parser and call its command (``merge_command_parser`` / ``merge_command``) the same
two functions, merging through :func:`accel.utils.merge_fsdp_weights`.

Example:
    >>> from accel.commands.merge import merge_command, merge_command_parser
    >>> args = merge_command_parser().parse_args(["ckpt/pytorch_model_fsdp_0", "merged"])
    >>> merge_command(args)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = (
    "Merge the shards of a model saved with FSDP's SHARDED_STATE_DICT into one set of weight "
    "files (model.safetensors, or pytorch_model.bin with --unsafe_serialization). No processes "
    "are started; the whole model is loaded into CPU memory."
)
#: Accelerate's name for the command's description.
description = DESCRIPTION


def merge_command(args: argparse.Namespace) -> None:
    """Merge ``args.checkpoint_directory`` into ``args.output_path`` (collective when distributed)."""
    from accel.ckpt_adapters import merge_fsdp_weights

    merge_fsdp_weights(
        args.checkpoint_directory,
        args.output_path,
        safe_serialization=not args.unsafe_serialization,
        remove_checkpoint_dir=args.remove_checkpoint_dir,
    )


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``merge-weights`` argument parser: standalone, or added to ``subparsers``."""
    if subparsers is not None:
        parser: argparse.ArgumentParser = subparsers.add_parser(
            "merge-weights", description=DESCRIPTION
        )
    else:
        parser = argparse.ArgumentParser(prog="accel merge-weights", description=DESCRIPTION)
    parser.add_argument(
        "checkpoint_directory", help="Folder of sharded weights saved by FSDP (has .metadata)."
    )
    parser.add_argument("output_path", help="Folder to write the merged weights into.")
    parser.add_argument(
        "--unsafe_serialization",
        action="store_true",
        help="Write pytorch_model.bin (pickle) instead of model.safetensors.",
    )
    parser.add_argument(
        "--remove_checkpoint_dir",
        action="store_true",
        help="Delete the checkpoint folder after a successful merge.",
    )
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


def main(argv: list[str] | None = None) -> None:
    """``python -m accel.commands.merge CHECKPOINT_DIR OUTPUT_PATH``."""
    merge_command(merge_command_parser().parse_args(argv))


if __name__ == "__main__":
    main()
