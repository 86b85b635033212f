"""Seeding and cross-process synchronisation of random number generators."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable
from typing import Any

import torch

from accel_data.errors import RNGSyncError
from accel_ops import broadcast
from accel_state.partial_state import PartialState
from accel_state.types import RNGType

# Accelerator-specific torch modules with get_rng_state/set_rng_state/manual_seed_all.
_DEVICE_MODULES = {
    RNGType.CUDA: "cuda",
    RNGType.MPS: "mps",
    RNGType.NPU: "npu",
    RNGType.XPU: "xpu",
    RNGType.MLU: "mlu",
    RNGType.SDAA: "sdaa",
    RNGType.MUSA: "musa",
    RNGType.HPU: "hpu",
    RNGType.NEURON: "neuron",
}

# Devices accel does not run on (Accelerate's MLU, SDAA, MUSA, HPU, Neuron); naming one for a
# device that is absent is an error even in a single process.
_ACCELERATE_ONLY_DEVICES = frozenset(
    {RNGType.MLU, RNGType.SDAA, RNGType.MUSA, RNGType.HPU, RNGType.NEURON}
)


def _device_module(rng_type: RNGType) -> object:
    """``torch.<device>`` for ``rng_type``, or a clear error when that device is absent here."""
    module = getattr(torch, _DEVICE_MODULES[rng_type], None)
    if module is None or not _device_available(module):
        raise RNGSyncError(
            f"rng_type={rng_type.value!r} needs a {rng_type.value.upper()} device, and torch has "
            f"no available torch.{_DEVICE_MODULES[rng_type]} in this process (its extension is "
            f"not installed or no device is visible); drop {rng_type.value!r} from rng_types."
        )
    return module


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy (when installed), torch and every accelerator's generator.

    Args:
        seed: The seed.
        device_specific: Add the process index, so each process draws different numbers.
        deterministic: Also ask torch for deterministic algorithms
            (``torch.use_deterministic_algorithms(True)``), which can be slower.

    """
    if device_specific:
        seed += PartialState().process_index
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily when CUDA is not started)
    for name in ("mps", "npu", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and _device_available(module):
            seed_all = getattr(module, "manual_seed_all", None) or module.manual_seed
            seed_all(seed)
    if "torch_xla" in sys.modules:  # only when the job already uses XLA
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _device_available(module: object) -> bool:
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


def _get_state(rng_type: RNGType, generator: torch.Generator | None) -> torch.Tensor:
    if rng_type == RNGType.TORCH:
        return torch.get_rng_state()
    if rng_type == RNGType.GENERATOR:
        if generator is None:
            raise RNGSyncError(
                "synchronize_rng_state(rng_type='generator') needs generator=<torch.Generator>; "
                "pass the sampler's generator, or drop 'generator' from rng_types."
            )
        return generator.get_state()
    if rng_type == RNGType.XLA:
        import torch_xla.core.xla_model as xm

        return torch.tensor(xm.get_rng_state(), dtype=torch.int64)
    module: Any = _device_module(rng_type)
    return module.get_rng_state()  # type: ignore[no-any-return]


def _set_state(rng_type: RNGType, generator: torch.Generator | None, state: torch.Tensor) -> None:
    if rng_type == RNGType.TORCH:
        torch.set_rng_state(state)
    elif rng_type == RNGType.GENERATOR:
        assert generator is not None
        generator.set_state(state)
    elif rng_type == RNGType.XLA:
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(int(state.item()))
    else:
        module: Any = _device_module(rng_type)
        module.set_rng_state(state)


def _as_rng_type(rng_type: RNGType | str) -> RNGType:
    try:
        return RNGType(rng_type)
    except ValueError:
        raise RNGSyncError(
            f"rng_type={rng_type!r} is not a generator accel can synchronise; use one of "
            f"{RNGType.list()}."
        ) from None


def synchronize_rng_state(
    rng_type: RNGType | str | None = None, generator: torch.Generator | None = None
) -> None:
    """Give every process the state of process 0's generator of kind ``rng_type``.

    Does nothing in a single process.

    Args:
        rng_type: ``"torch"``, ``"cuda"``, ``"xla"``, ``"mps"``, ``"npu"``, ``"xpu"`` or
            ``"generator"`` (default ``"torch"``).
        generator: The generator to synchronise when ``rng_type="generator"``.

    Raises:
        RNGSyncError: Unknown ``rng_type``, or ``"generator"`` without a generator.

    """
    kind = _as_rng_type(rng_type if rng_type is not None else RNGType.TORCH)
    state = PartialState()
    if state.num_processes <= 1:
        if kind == RNGType.GENERATOR and generator is None:
            _get_state(kind, generator)  # same error as in a job
        if kind in _ACCELERATE_ONLY_DEVICES:
            _device_module(kind)  # a device that does not exist is an error on one process too
        return
    rng_state = _get_state(kind, generator)
    if state.backend in ("nccl", "xla"):  # these only move device tensors
        rng_state = broadcast(rng_state.to(state.device)).cpu()
    else:
        rng_state = broadcast(rng_state)
    _set_state(kind, generator, rng_state)


def synchronize_rng_states(
    rng_types: Iterable[RNGType | str], generator: torch.Generator | None = None
) -> None:
    """:func:`synchronize_rng_state` for each kind in ``rng_types``, in order."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
