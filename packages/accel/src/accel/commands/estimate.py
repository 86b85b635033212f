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

from accel.commands._parsers import command_parser
from accel.commands.memory_spec import DTYPE_BYTES, HubModelError, ModelSpecError

DEFAULT_DTYPES = ("float32", "float16", "int8", "int4")

EXAMPLE = "accel estimate-memory torchvision.models:resnet50 --dtypes float32 bfloat16"


__all__ = [
    "DEFAULT_DTYPES",
    "add_timm_hub_prefix",
    "estimate_command",
    "estimate_command_parser",
    "gather_data",
    "register",
    "verify_on_hub",
]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``estimate-memory`` to the ``accel`` command line (entry point ``accel.commands``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
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
    parser.set_defaults(handler=run_estimate)
    return parser


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's parser builder: standalone, or added to ``subparsers`` (``func`` set)."""
    return command_parser(register, subparsers, run_estimate)


def add_timm_hub_prefix(model_name: str) -> str:
    """``timm``'s spelling of a Hub repo id: ``owner/name`` -> ``hf-hub:owner/name``.

    A bare architecture name (``resnet50``, no ``/``) and a name that already names its source
    (``hf-hub:...``, ``local-dir:...``) are returned unchanged.
    """
    has_source = ":" in model_name
    is_repo_id = "/" in model_name
    return f"hf-hub:{model_name}" if is_repo_id and not has_source else model_name


def verify_on_hub(repo: str, token: str | None = None) -> str:
    """Accelerate's Hub check; accel's ``estimate-memory`` never queries the Hub.

    Raises:
        HubModelError: Always, naming what to pass instead (a ``module:callable`` spec).
    """
    raise HubModelError(_hub_message(repo))


def _hub_message(spec: str) -> str:
    return (
        f"MODEL_SPEC {spec!r} is not module:callable. accel cannot download Hub models; name a "
        "function or class that builds the model, e.g. mypkg.models:build or "
        "torchvision.models:resnet50."
    )


def _refused_flags(args: argparse.Namespace) -> str | None:
    used = [
        f"--{name}" for name in ("library_name", "trust_remote_code") if getattr(args, name, None)
    ]
    if not used:
        return None
    return (
        f"{' and '.join(used)}: accel estimate-memory does not download models from the Hugging "
        "Face Hub (Accelerate's meaning of these flags). Pass MODEL_SPEC as module:callable that "
        "builds the model instead, e.g. a function returning "
        "transformers.AutoModel.from_config(config)."
    )


def _spec(args: argparse.Namespace) -> str:
    """The model to measure: ``args.model_spec`` (accel's parser) or ``args.model_name``."""
    return str(getattr(args, "model_spec", None) or getattr(args, "model_name", ""))


def _estimate(args: argparse.Namespace) -> Any:
    """Build the model ``args`` names on meta and estimate its memory per dtype.

    Raises:
        HubModelError: The spec is a Hub model name (accel does not download models; an OSError
            too, as "this model cannot be obtained").
        ModelSpecError: A refused flag, bad ``--model_kwargs``, or a spec that does not build.
    """
    refused = _refused_flags(args)
    if refused:
        raise ModelSpecError(refused)
    spec = _spec(args)
    module_part, sep, attribute = spec.rpartition(":")
    if not (sep and module_part and attribute):
        raise HubModelError(_hub_message(spec))
    from accel.commands.memory_estimate import estimate_model_memory, load_model_spec

    raw_kwargs = getattr(args, "model_kwargs", None)
    try:
        kwargs: dict[str, Any] = json.loads(raw_kwargs) if raw_kwargs else {}
    except json.JSONDecodeError as error:
        raise ModelSpecError(
            f"--model_kwargs={raw_kwargs!r} is not JSON ({error.msg}); write e.g. "
            "'{\"hidden\": 64}'."
        ) from None
    if not isinstance(kwargs, dict):
        raise ModelSpecError(f"--model_kwargs={raw_kwargs!r} must be a JSON object.")
    model = load_model_spec(spec, kwargs)
    dtypes = list(dict.fromkeys(getattr(args, "dtypes", None) or DEFAULT_DTYPES))
    return estimate_model_memory(model, dtypes)


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Accelerate's rows: ``[dtype, largest layer bytes, total bytes, training bytes by part]``.

    The last item maps ``model``, ``gradients``, ``optimizer`` (Adam's two moments) and ``step``
    (all of them together) to bytes; ``-1`` where the dtype cannot be trained (int8, int4).

    Raises:
        HubModelError: The spec is a Hub model name.
        ModelSpecError: The spec does not build a model.
    """
    estimate = _estimate(args)
    return [
        [
            row.dtype,
            row.largest_layer,
            row.weights,
            {
                "model": row.weights if row.training is not None else -1,
                "gradients": row.gradients if row.gradients is not None else -1,
                "optimizer": row.adam if row.adam is not None else -1,
                "step": row.training if row.training is not None else -1,
            },
        ]
        for row in estimate.rows
    ]


def estimate_command(args: argparse.Namespace) -> int:
    """Print the estimate table (or JSON with ``--json``); return 0.

    Raises:
        HubModelError: The spec is a Hub model name (accel does not download models).
        ModelSpecError: A refused flag, bad ``--model_kwargs``, or a spec that does not build.
    """
    estimate = _estimate(args)
    from accel.commands.memory_estimate import format_table

    if getattr(args, "json", False):
        print(json.dumps({"model": _spec(args), **estimate.to_dict()}, indent=2))
    else:
        print(format_table(_spec(args), estimate))
    return 0


def run_estimate(args: argparse.Namespace) -> int:
    """``accel estimate-memory``: :func:`estimate_command`, its errors as one line and exit code 2."""
    try:
        return estimate_command(args)
    except ModelSpecError as error:
        print(f"accel estimate-memory: error: {error}", file=sys.stderr)
        return 2
