"""Capture and restore every random number generator a training process uses.

Python's ``random``, numpy's global generator (when numpy is installed), torch's CPU generator,
every CUDA device's generator (when CUDA is initialised), MPS's and XLA's (when in use).
"""

from __future__ import annotations

import logging
import random
import sys
from typing import Any

import torch

logger = logging.getLogger(__name__)


def capture_rng_states() -> dict[str, Any]:
    """The current states of all generators, keyed ``python``, ``numpy``, ``torch``, ``cuda``..."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy
    except ImportError:
        pass
    else:
        states["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        states["mps"] = mps.get_rng_state()
    if "torch_xla" in sys.modules:
        import torch_xla.core.xla_model as xm

        states["xla"] = xm.get_rng_state()
    return states


def restore_rng_states(states: dict[str, Any], where: str) -> None:
    """Restore the generators captured by :func:`capture_rng_states`; ``where`` is for logs.

    Generators the checkpoint has but this process lacks (numpy not imported, no CUDA...) are
    skipped with a log message.
    """
    random.setstate(_python_state(states["python"]))
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        try:
            import numpy
        except ImportError:
            logger.info("%s holds a numpy RNG state but numpy is not installed; skipped.", where)
        else:
            numpy.random.set_state(states["numpy"])
    if "cuda" in states:
        if torch.cuda.is_available():
            cuda_states = states["cuda"][: torch.cuda.device_count()]
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.info("%s holds CUDA RNG states but CUDA is unavailable; skipped.", where)
    if "mps" in states and torch.backends.mps.is_available():
        torch.mps.set_rng_state(states["mps"])
    if "xla" in states:
        if "torch_xla" in sys.modules or _has_xla():
            import torch_xla.core.xla_model as xm

            xm.set_rng_state(states["xla"])
        else:
            logger.info("%s holds an XLA RNG state but torch_xla is not installed; skipped.", where)


def derive_rng_states(states: dict[str, Any], rank: int, where: str) -> int:
    """Give process ``rank`` a stream of its own from another process's saved states.

    For a process that has no saved RNG state (a checkpoint saved by fewer processes): restore
    ``states`` (those of process ``rank % N``), draw a 62-bit number from the restored torch
    generator, hash it with ``rank`` and seed Python's, numpy's and torch's generators (every
    device's) with the result. Deterministic for a given checkpoint and rank, and distinct from
    every other process's stream.

    Returns:
        The seed used.
    """
    import hashlib

    restore_rng_states(states, where)
    drawn = int(torch.randint(0, 2**62, (1,)).item())
    digest = hashlib.sha256(f"{drawn}:{rank}".encode()).digest()
    seed = int.from_bytes(digest[:8], "little") & (2**63 - 1)
    random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed % 2**32)
    return seed


def _python_state(state: Any) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


def _has_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None
