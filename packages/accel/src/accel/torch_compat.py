"""accel's side of the torch-version layer: feature gates raised as accel's errors.

Every version-dependent import and behaviour below accel is in ``accel_state.torch_compat``,
which also holds the feature gates (data: feature, minimum torch, reason, alternative). accel's
features ask here before they touch an API a torch release may lack, so an old torch fails at
``Accelerator(...)``/``prepare()`` with a sentence naming the feature, the torch found, the
release needed and what works instead.

Example:
    >>> from accel.torch_compat import require_torch_feature
    >>> require_torch_feature("fsdp2")  # TorchVersionError on torch 2.4 and 2.5  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from accel.errors import TorchVersionError
from accel_state.torch_compat import GATES, FeatureGate, is_dtensor, torch_at_least


def require_torch_feature(key: str, device_type: str | None = None) -> None:
    """Raise unless the running torch has the feature of gate ``key`` (``GATES[key]``).

    Args:
        key: The gate's key.
        device_type: The job's device type (``"cpu"`` applies the gate's CPU/gloo minimum).

    Raises:
        TorchVersionError: The feature needs a newer torch; the message says which and what
            works instead.
        KeyError: ``key`` names no gate.
    """
    if key not in GATES:
        raise KeyError(f"require_torch_feature({key!r}): no such gate; known: {sorted(GATES)}")
    GATES[key].require(error=TorchVersionError, device_type=device_type)


def fsdp2_api(name: str) -> Any:
    """An FSDP2 class or function by name (``FSDPModule``, ``OffloadPolicy``...).

    Public in ``torch.distributed.fsdp`` from torch 2.6, in ``torch.distributed._composable.fsdp``
    in 2.4 and 2.5: FSDP1 code asks for the classes to recognise FSDP2 objects on any torch.

    Raises:
        AttributeError: Neither module has ``name``.
    """
    import torch.distributed.fsdp as public

    if hasattr(public, name):
        return getattr(public, name)
    from torch.distributed._composable import fsdp as private

    return getattr(private, name)


def fsdp2_root_reshard_after_forward() -> bool | None:
    """``reshard_after_forward`` that lets torch choose for FSDP2's root module.

    ``None`` where ``fully_shard`` takes it (torch keeps the root's parameters gathered after
    forward, as backward needs them first); ``True``, its only default, on torch 2.6 and 2.7.
    """
    import inspect

    from torch.distributed.fsdp import fully_shard

    parameter = inspect.signature(fully_shard).parameters.get("reshard_after_forward")
    takes_none = parameter is not None and parameter.default is None
    return None if takes_none else True


__all__ = [
    "GATES",
    "FeatureGate",
    "fsdp2_api",
    "fsdp2_root_reshard_after_forward",
    "is_dtensor",
    "require_torch_feature",
    "torch_at_least",
]
