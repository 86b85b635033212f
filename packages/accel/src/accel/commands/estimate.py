"""``accel estimate-memory MODEL_SPEC``: memory a model needs for weights, gradients and Adam.

Registered as an ``accel`` subcommand through the ``accel.commands`` entry-point group; importing
this module imports argparse only (torch is imported when the command runs). The model is built on
the meta device, so nothing is allocated, and a model of any size is measured in a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from accel.commands.memory_spec import DTYPE_BYTES, ModelSpecError

DEFAULT_DTYPES = ("float32", "float16", "int8", "int4")

EXAMPLE = "accel estimate-memory torchvision.models:resnet50 --dtypes float32 bfloat16"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``estimate-memory`` to the ``accel`` command line (entry point ``accel.commands``)."""
    parser = subparsers.add_parser(
        "estimate-memory",
        help="Estimate the memory a model needs to load and to train with Adam.",
        description=(
            "Build the model on the meta device (nothing is allocated) and report, per dtype, "
            "the memory of its parameters, their gradients and Adam's two moment buffers, and "
            f"its largest layer. Example: {EXAMPLE}"
        ),
    )
    parser.add_argument(
        "model_spec",
        metavar="MODEL_SPEC",
        help="module:callable or module:Class returning an nn.Module (e.g. mypkg.models:build); "
        "a path/to/file.py:callable works too. Hub model names cannot be downloaded.",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=list(DEFAULT_DTYPES),
        choices=list(DTYPE_BYTES),
        help=f"dtypes to report (default: {' '.join(DEFAULT_DTYPES)}).",
    )
    parser.add_argument(
        "--model_kwargs",
        "--model-kwargs",
        default=None,
        help="Keyword arguments for the callable, as a JSON object: '{\"hidden\": 1024}'.",
    )
    parser.add_argument(
        "--json", action="store_true", help="Print exact byte counts as JSON instead of a table."
    )
    for flag in ("--library_name", "--trust_remote_code"):
        parser.add_argument(
            flag,
            flag.replace("_", "-"),
            dest=flag[2:],
            nargs="?",
            const=True,
            default=None,
            help=argparse.SUPPRESS,
        )
    parser.set_defaults(handler=estimate_command)


def _refused_flags(args: argparse.Namespace) -> str | None:
    used = [f"--{name}" for name in ("library_name", "trust_remote_code") if getattr(args, name)]
    if not used:
        return None
    return (
        f"{' and '.join(used)}: accel estimate-memory does not download models from the Hugging "
        "Face Hub (Accelerate's meaning of these flags). Pass MODEL_SPEC as module:callable that "
        "builds the model instead, e.g. a function returning "
        "transformers.AutoModel.from_config(config)."
    )


def estimate_command(args: argparse.Namespace) -> int:
    """Run ``accel estimate-memory``; print the table (or JSON); return the exit code."""
    refused = _refused_flags(args)
    if refused:
        print(f"accel estimate-memory: error: {refused}", file=sys.stderr)
        return 2
    module_part, sep, attribute = args.model_spec.rpartition(":")
    if not (sep and module_part and attribute):
        print(
            f"accel estimate-memory: error: MODEL_SPEC {args.model_spec!r} is not "
            "module:callable. accel cannot download Hub models; name a function or class that "
            "builds the model, e.g. mypkg.models:build or torchvision.models:resnet50.",
            file=sys.stderr,
        )
        return 2
    from accel.commands.memory_estimate import estimate_model_memory, format_table, load_model_spec

    try:
        kwargs: dict[str, Any] = json.loads(args.model_kwargs) if args.model_kwargs else {}
        if not isinstance(kwargs, dict):
            raise ModelSpecError(f"--model_kwargs={args.model_kwargs!r} must be a JSON object.")
        model = load_model_spec(args.model_spec, kwargs)
    except json.JSONDecodeError as error:
        print(
            f"accel estimate-memory: error: --model_kwargs={args.model_kwargs!r} is not JSON "
            f"({error.msg}); write e.g. '{{\"hidden\": 64}}'.",
            file=sys.stderr,
        )
        return 2
    except ModelSpecError as error:
        print(f"accel estimate-memory: error: {error}", file=sys.stderr)
        return 2
    dtypes = list(dict.fromkeys(args.dtypes))
    estimate = estimate_model_memory(model, dtypes)
    if args.json:
        print(json.dumps({"model": args.model_spec, **estimate.to_dict()}, indent=2))
    else:
        print(format_table(args.model_spec, estimate))
    return 0
