"""FSDP mixed precision: the dtypes of a plugin's policy, and torch's policy object for them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.precision import autocast_dtype


def torch_policy(version: int | None, dtypes: Mapping[str, Any]) -> Any:
    """The torch ``MixedPrecision`` (FSDP1) or ``MixedPrecisionPolicy`` (FSDP2) for dtypes."""
    if version == 1:
        from torch.distributed.fsdp import MixedPrecision

        keys: tuple[str, ...] = ("param_dtype", "reduce_dtype", "buffer_dtype")
        return MixedPrecision(**{key: dtypes[key] for key in keys if key in dtypes})
    from torch.distributed.fsdp import MixedPrecisionPolicy

    keys = ("param_dtype", "reduce_dtype", "output_dtype")
    return MixedPrecisionPolicy(**{key: dtypes[key] for key in keys if key in dtypes})


def mixed_precision_dtypes(policy: Any, precision: str) -> dict[str, torch.dtype | None]:
    """``param_dtype``/``reduce_dtype``/``buffer_dtype`` from the plugin's policy or the precision.

    Raises:
        AcceleratorConfigError: The policy is neither a dict nor a torch policy object.
    """
    if policy is None:
        # fp8 runs its fp8 layers' matmuls in float8 and everything else in bf16 (Accelerate's).
        compute = autocast_dtype(precision)
        if compute is None:
            return {"param_dtype": None, "reduce_dtype": None, "buffer_dtype": None}
        return {"param_dtype": compute, "reduce_dtype": torch.float32, "buffer_dtype": None}
    if isinstance(policy, Mapping):
        unknown = set(policy) - {"param_dtype", "reduce_dtype", "buffer_dtype", "output_dtype"}
        if unknown:
            raise AcceleratorConfigError(
                f"mixed_precision_policy has unknown keys {sorted(unknown)}; use param_dtype, "
                "reduce_dtype, buffer_dtype."
            )
        return {
            key: to_dtype(policy.get(key))
            for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
        }
    if hasattr(policy, "param_dtype"):
        return {
            key: getattr(policy, key, None)
            for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
        }
    raise AcceleratorConfigError(
        f"mixed_precision_policy={policy!r}: pass a dict of dtypes or torch's MixedPrecisionPolicy."
    )


def to_dtype(value: Any) -> torch.dtype | None:
    """A torch dtype from a dtype or its name (``"bfloat16"``, ``"torch.float16"``)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value).replace("torch.", ""), None)
    if not isinstance(found, torch.dtype):
        raise AcceleratorConfigError(
            f"mixed_precision_policy dtype {value!r} is not a torch dtype (e.g. 'bfloat16')."
        )
    return found
