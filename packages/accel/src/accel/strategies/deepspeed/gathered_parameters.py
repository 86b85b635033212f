"""``GatheredParameters``: ZeRO-3 partitioned parameters whole for a block, else a no-op.

Example:
    >>> import torch
    >>> from accel.utils import GatheredParameters
    >>> layer = torch.nn.Linear(2, 2)
    >>> with GatheredParameters(layer.parameters(), modifier_rank=0):
    ...     _ = layer.weight.shape
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch


def _partitioned(params: list[torch.Tensor]) -> bool:
    """Whether any of ``params`` is partitioned by DeepSpeed ZeRO-3 (carries a ``ds_id``)."""
    return any(hasattr(param, "ds_id") for param in params)


class GatheredParameters:
    """Gather ZeRO-3 partitioned parameters on entry; scatter (and broadcast edits) on exit.

    Parameters that DeepSpeed does not partition (no ZeRO-3, or plain modules) need nothing, and
    the block runs unchanged, as Accelerate's does without DeepSpeed.

    Args:
        params: A parameter or an iterable of them.
        modifier_rank: The rank whose in-block changes are kept (``None``: read only).
        fwd_module: Module whose forward hooks register external parameters (DeepSpeed's).
        enabled: ``False`` makes the block a no-op.
    """

    def __init__(
        self,
        params: torch.nn.Parameter | Iterable[torch.nn.Parameter],
        modifier_rank: int | None = None,
        fwd_module: torch.nn.Module | None = None,
        enabled: bool = True,
    ) -> None:
        listed = [params] if isinstance(params, torch.Tensor) else list(params)
        self._context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if enabled and _partitioned(listed):
            from accel.strategies.deepspeed.plugin import import_deepspeed

            deepspeed = import_deepspeed()
            self._context = deepspeed.zero.GatheredParameters(
                listed, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=True
            )

    def __enter__(self) -> None:
        self._context.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._context.__exit__(exc_type, exc, traceback)


__all__ = ["GatheredParameters"]
