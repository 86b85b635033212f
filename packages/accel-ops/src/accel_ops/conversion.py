"""Dtype and type conversions over nested structures: half precision to fp32, tensors to lists."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import Any

import torch

from accel_ops.structures import recursively_apply

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _is_half_precision(data: Any) -> bool:
    return isinstance(data, torch.Tensor) and data.dtype in _HALF_DTYPES


def _to_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float()


def convert_to_fp32(tensor: Any) -> Any:
    """Cast every float16 / bfloat16 tensor in (or equal to) ``tensor`` to float32; other leaves pass through."""
    return recursively_apply(_to_float32, tensor, test_type=_is_half_precision)


class ConvertOutputsToFp32:
    """Wrap a forward function so that its half-precision outputs come back in float32.

    Args:
        model_forward: The function to wrap (usually ``model.forward``).

    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped forward and cast its float16/bfloat16 outputs to float32."""
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "A forward wrapped by convert_outputs_to_fp32 cannot be pickled; unwrap the model "
            "(use the original forward) before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Return a function calling ``model_forward`` and casting its half outputs to float32."""
    wrapped = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapped(*args, **kwargs)

    forward.__wrapped__ = wrapped  # type: ignore[attr-defined]
    return forward


def _tensor_to_list(tensor: torch.Tensor) -> Any:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.tolist()


def listify(data: Any) -> Any:
    """Turn every tensor in ``data`` into (nested) Python lists or numbers; containers are kept."""
    return recursively_apply(_tensor_to_list, data)
