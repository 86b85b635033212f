"""The arithmetic behind ``accel estimate-memory``: load a model spec on meta, count, tabulate.

For a dtype of ``b`` bytes and ``N`` trainable-or-not parameters the estimate is
``weights = N*b``, ``gradients = N*b``, ``Adam = 2*N*b`` (``torch.optim.Adam`` keeps its two
moment buffers in the parameters' dtype) and ``training = 4*N*b``. Integer dtypes hold quantized
weights for inference, so they have no gradient or optimizer columns. Activations come on top.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from accel.commands.memory_spec import DTYPE_BYTES, INFERENCE_ONLY, ModelSpecError


def _import_module(part: str, spec: str) -> ModuleType:
    if part.endswith(".py") or os.sep in part:
        path = Path(part).resolve()
        if not path.is_file():
            raise ModelSpecError(f"MODEL_SPEC {spec!r}: the file {str(path)!r} does not exist.")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelSpecError(f"MODEL_SPEC {spec!r}: cannot import {str(path)!r}.")
        module = importlib.util.module_from_spec(loader_spec)
        sys.path.insert(0, str(path.parent))
        loader_spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules of the current folder
    try:
        return importlib.import_module(part)
    except ImportError as error:
        raise ModelSpecError(
            f"MODEL_SPEC {spec!r}: cannot import module {part!r} ({error}). Run from the folder "
            "that holds it, install its package, or give a path: path/to/models.py:build."
        ) from None


def load_model_spec(spec: str, kwargs: dict[str, Any] | None = None) -> nn.Module:
    """Build the model ``spec`` names (``module:callable`` or ``file.py:Class``) on meta.

    Raises:
        ModelSpecError: The spec is malformed, does not import, or does not build a module.
    """
    module_part, sep, attribute = spec.rpartition(":")
    if not sep or not module_part or not attribute:
        raise ModelSpecError(
            f"MODEL_SPEC {spec!r} is not module:callable. accel cannot download Hub models; "
            "name a function or class that builds the model, e.g. mypkg.models:build or "
            "torchvision.models:resnet50."
        )
    target: Any = _import_module(module_part, spec)
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise ModelSpecError(f"MODEL_SPEC {spec!r}: {module_part!r} has no {attribute!r}.")
        target = getattr(target, name)
    if not callable(target):
        raise ModelSpecError(f"MODEL_SPEC {spec!r}: {attribute!r} is not callable.")
    try:
        with torch.device("meta"):
            model = target(**(kwargs or {}))
    except Exception as error:
        raise ModelSpecError(
            f"MODEL_SPEC {spec!r}: building the model on the meta device raised "
            f"{type(error).__name__}: {error}"
        ) from error
    if not isinstance(model, nn.Module):
        raise ModelSpecError(
            f"MODEL_SPEC {spec!r} returned {type(model).__name__}, not a torch.nn.Module."
        )
    return model


@dataclasses.dataclass(frozen=True)
class DtypeEstimate:
    """Bytes for one dtype; ``None`` where the dtype cannot be trained."""

    dtype: str
    largest_layer: int
    weights: int
    gradients: int | None
    adam: int | None
    training: int | None


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Counts of a model and its per-dtype byte estimates."""

    parameters: int
    buffers: int
    largest_layer_name: str
    largest_layer_parameters: int
    rows: list[DtypeEstimate]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (exact bytes)."""
        return dataclasses.asdict(self)


def _nbytes(elements: int, dtype: str) -> int:
    return math.ceil(elements * DTYPE_BYTES[dtype])


def estimate_model_memory(model: nn.Module, dtypes: list[str]) -> MemoryEstimate:
    """Count ``model``'s parameters (shared ones once) and estimate bytes per dtype."""
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    largest_name, largest = "", -1
    for name, module in model.named_modules():
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if own > largest:
            largest_name, largest = name or "(root)", own
    rows = []
    for dtype in dtypes:
        weights = _nbytes(parameters, dtype)
        trainable = dtype not in INFERENCE_ONLY
        gradients = weights if trainable else None
        adam = 2 * weights if trainable else None
        training = weights + 3 * weights if trainable else None
        rows.append(
            DtypeEstimate(dtype, _nbytes(largest, dtype), weights, gradients, adam, training)
        )
    return MemoryEstimate(parameters, buffers, largest_name, max(largest, 0), rows)


def format_bytes(size: int | None) -> str:
    """``1536`` -> ``"1.50 KiB"``; ``None`` -> ``"-"``."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_table(spec: str, estimate: MemoryEstimate) -> str:
    """The estimate as a plain-text table with a header and a footnote."""
    header = ["dtype", "Largest layer", "Weights", "Gradients", "Adam states", "Training total"]
    body = [
        [
            row.dtype,
            format_bytes(row.largest_layer),
            format_bytes(row.weights),
            format_bytes(row.gradients),
            format_bytes(row.adam),
            format_bytes(row.training),
        ]
        for row in estimate.rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
            + " |"
        )

    rule = "+-" + "-+-".join("-" * width for width in widths) + "-+"
    lines = [
        f"Memory estimate for {spec}: {estimate.parameters:,} parameters; largest layer "
        f"{estimate.largest_layer_name} ({estimate.largest_layer_parameters:,} parameters)",
        rule,
        line(header),
        rule,
        *(line(cells) for cells in body),
        rule,
        "Training total = weights + gradients + Adam's two moment buffers, all in the dtype "
        "(torch.optim.Adam keeps its state in the parameters' dtype); activations come on top.",
        "int8/int4 are quantized weights for inference: no gradients or optimizer.",
    ]
    if estimate.buffers:
        lines.append(f"Buffers (not counted above): {estimate.buffers:,} elements.")
    return "\n".join(lines)
