"""``accel estimate-memory MODEL_SPEC``: memory a model needs for weights, gradients and Adam.

Registered as an ``accel`` subcommand through the ``accel.commands`` entry-point group; importing
this module imports argparse only (torch is imported when the command runs). The model is built on
the meta device, so nothing is allocated, and a model of any size is measured in a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from accel.commands._parsers import command_parser
from accel.commands.memory_spec import DTYPE_BYTES, HubModelError, ModelSpecError

if TYPE_CHECKING:
    from torch import nn

DEFAULT_DTYPES = ("float32", "float16", "int8", "int4")

EXAMPLE = "accel estimate-memory torchvision.models:resnet50 --dtypes float32 bfloat16"


__all__ = [
    "DEFAULT_DTYPES",
    "add_timm_hub_prefix",
    "check_has_model",
    "create_ascii_table",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "estimate_training_usage",
    "gather_data",
    "main",
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


def _library_available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _raised_by(error: BaseException, class_name: str) -> bool:
    return any(cls.__name__ == class_name for cls in type(error).__mro__)


def check_has_model(error: BaseException) -> str:
    """Which library failed to find a model: ``timm``, ``transformers`` or ``unknown``.

    Accelerate's classification of the error a failed model build raised.

    ``timm``: a ``RuntimeError`` "Unknown model", huggingface_hub's ``EntryNotFoundError`` or a
    ``KeyError`` naming the architecture, with timm installed. ``transformers``: an ``OSError`` or
    ``ValueError`` saying a file is missing or the model is unrecognized, with transformers
    installed.
    """
    message = str(error)
    if _library_available("timm") and (
        (isinstance(error, RuntimeError) and "Unknown model" in message)
        or _raised_by(error, "EntryNotFoundError")
        or (isinstance(error, KeyError) and "architecture" in message)
    ):
        return "timm"
    if (
        _library_available("transformers")
        and isinstance(error, (OSError, ValueError))
        and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message
        )
    ):
        return "transformers"
    return "unknown"


def create_empty_model(
    model_name: str,
    library_name: str | None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> nn.Module:
    """Build ``model_name`` on the meta device (float32, nothing allocated) to measure it.

    ``model_name`` is a local folder holding a transformers ``config.json`` (built with
    ``AutoModel.from_config``; ``library_name`` ``None`` or ``"transformers"``) or a
    ``module:callable`` spec as ``accel estimate-memory`` takes. Accelerate also reads Hub repo
    ids; accel never downloads, so a Hub name raises (``access_token`` is accepted for
    Accelerate's signature and only ever used by the Hub).

    Raises:
        ValueError: ``library_name`` is not ``transformers`` or ``timm``.
        HubModelError: ``model_name`` is a Hub repo id (an ``OSError``).
        ModelSpecError: A ``module:callable`` spec does not build a model.
        ImportError: The folder needs transformers, which is not installed.
    """
    if library_name not in (None, "transformers", "timm"):
        raise ValueError(
            f"library_name={library_name!r} is not supported; use 'transformers' or 'timm'."
        )
    if os.path.isfile(os.path.join(model_name, "config.json")) and library_name != "timm":
        if not _library_available("transformers"):
            raise ImportError(
                f"To check `{model_name}`, `transformers` must be installed. Please install it "
                "via `pip install transformers`"
            )
        import torch
        from transformers import AutoConfig, AutoModel

        config = AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model: nn.Module = AutoModel.from_config(
                config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code
            )
        return model
    module_part, sep, attribute = model_name.rpartition(":")
    if sep and module_part and attribute and module_part != "hf-hub":
        from accel.commands.memory_estimate import load_model_spec

        return load_model_spec(model_name)
    raise HubModelError(_hub_message(model_name))


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A box-drawn table of ``rows`` (strings) under ``headers``, with ``title`` on top.

    Cells are centred; the last column widens when the title is wider than the columns.
    """
    widths = [
        max(len(str(cell)) for cell in [header, *(row[i] for row in rows)])
        for i, header in enumerate(headers)
    ]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def rule(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * width for width in widths) + right

    def line(cells: list[str]) -> str:
        return "│" + "│".join(str(c).center(w) for c, w in zip(cells, widths, strict=True)) + "│"

    return "\n".join(
        [
            "┌" + "─" * inner + "┐",
            "│" + title.center(inner) + "│",
            rule("├", "┬", "┤"),
            line(headers),
            rule("├", "┼", "┤"),
            *(line(row) for row in rows),
            rule("└", "┴", "┘"),
        ]
    )


def estimate_training_usage(
    bytes: int,  # Accelerate's parameter name
    mixed_precision: str,
    msamp_config: str | None = None,
) -> dict[str, int]:
    """Accelerate's Adam training memory at batch size 1 for a model of ``bytes`` (float32).

    Returns ``{"model", "gradients", "optimizer", "step"}`` in bytes. ``float32``: weights,
    gradients the same, Adam's moments twice that, ``step`` (the peak) four times the weights.
    ``float16``/``bfloat16`` (and ``fp8`` without an MS-AMP config, which saves nothing): float32
    master weights, 1.5x for gradients, 2x for the moments, ``step`` = the moments. Anything else
    (int8, int4, fp8 with MS-AMP) cannot be estimated: every value is ``-1``.
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    full, half = bytes, bytes // 2
    if mixed_precision == "float32":
        sizes.update(model=full, gradients=full, optimizer=2 * full, step=4 * full)
    elif mixed_precision in ("float16", "bfloat16") or (
        mixed_precision == "fp8" and msamp_config is None
    ):
        sizes.update(model=full, gradients=full + half, optimizer=2 * full, step=2 * full)
    return sizes


def main(argv: list[str] | None = None) -> int:
    """``python -m accel.commands.estimate MODEL_SPEC``: the standalone command; its exit code."""
    parser = estimate_command_parser()
    return run_estimate(parser.parse_args(argv))


def run_estimate(args: argparse.Namespace) -> int:
    """``accel estimate-memory``: :func:`estimate_command`, its errors as one line and exit code 2."""
    try:
        return estimate_command(args)
    except ModelSpecError as error:
        print(f"accel estimate-memory: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
