"""torch_xla code paths. ``torch_xla`` is imported inside each function, never at import time."""

from __future__ import annotations

import importlib
import pickle
from types import ModuleType
from typing import Any

import torch

from accel_ops.errors import XLAUnavailableError

_REDUCE_TYPES = {"sum": "REDUCE_SUM", "mean": "REDUCE_SUM", "max": "REDUCE_MAX"}


def xla_model() -> ModuleType:
    """Import ``torch_xla.core.xla_model``.

    Raises:
        XLAUnavailableError: torch_xla is not installed.

    """
    try:
        module = importlib.import_module("torch_xla.core.xla_model")
    except ImportError as error:
        raise XLAUnavailableError(
            "The process group uses the 'xla' backend but torch_xla cannot be imported "
            f"({error}); install it with: pip install 'accel-ops[xla]'."
        ) from error
    return module


def device() -> torch.device:
    """The XLA device of this process."""
    xm = xla_model()
    import torch_xla

    if hasattr(torch_xla, "device"):
        return torch.device(torch_xla.device())
    return torch.device(xm.xla_device())


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """All-gather ``tensor`` (at least 1-d) along dimension 0."""
    result: torch.Tensor = xla_model().all_gather(tensor, dim=0)
    return result


def all_reduce(tensor: torch.Tensor, reduction: str, scale: float) -> torch.Tensor:
    """All-reduce ``tensor`` with ``reduction`` (``sum``, ``mean`` or ``max``), times ``scale``.

    The graph is cut before and after so that every process traces the same one. The scale
    is applied here rather than by torch_xla, which skips it when there is a single replica.
    """
    xm = xla_model()
    sync()
    result: torch.Tensor = xm.all_reduce(getattr(xm, _REDUCE_TYPES[reduction]), tensor)
    if scale != 1:
        result = result * scale
    sync()
    return result


def sync() -> None:
    """Cut the traced graph here and run it (``torch_xla.sync``, formerly ``xm.mark_step``).

    Raises:
        XLAUnavailableError: torch_xla is not installed.

    """
    xm = xla_model()
    run = getattr(importlib.import_module("torch_xla"), "sync", None)
    if run is not None:
        run()
    else:  # torch_xla < 2.6
        xm.mark_step()


def broadcast(tensor: torch.Tensor, from_process: int) -> torch.Tensor:
    """Overwrite ``tensor`` with the one held by ``from_process`` and return it."""
    xm = xla_model()
    if hasattr(xm, "collective_broadcast"):
        xm.collective_broadcast([tensor], root_ordinal=from_process)
        return tensor
    source = xm.mesh_reduce("accel_ops.broadcast", tensor, lambda parts: parts[from_process])
    return tensor.copy_(source)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every process's picklable ``obj``, by ordinal (out of graph, through the host).

    Pickled here rather than by ``xm.mesh_reduce``, whose ``torch.load`` (``weights_only``
    since torch 2.6) refuses objects of other classes than tensors and builtins.
    """
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    parts = xla_model().rendezvous("accel_ops.all_gather_objects", payload)
    return [pickle.loads(part) for part in parts]


def broadcast_objects(objects: list[Any], from_process: int) -> list[Any]:
    """The ``objects`` list held by ``from_process`` (out of graph, through the host)."""
    payload = pickle.dumps(list(objects), protocol=pickle.HIGHEST_PROTOCOL)
    parts = xla_model().rendezvous("accel_ops.broadcast_objects", payload)
    chosen: list[Any] = pickle.loads(parts[from_process])
    return chosen
