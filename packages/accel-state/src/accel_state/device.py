"""Choosing this process's device and the communication backend that goes with it."""

from __future__ import annotations

import importlib.util

import torch
import torch.distributed as dist

from accel_state.cluster.base import ProcessLayout
from accel_state.cluster.xla import torch_xla_available
from accel_state.errors import DeviceSelectionError


def xpu_available() -> bool:
    """Whether an Intel XPU is usable through ``torch.xpu``."""
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def mps_available() -> bool:
    """Whether Apple's Metal backend is usable."""
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def select_device(
    layout: ProcessLayout, *, use_cpu: bool = False, use_xla: bool = False
) -> torch.device:
    """Pick the device for this process and make it current.

    Order: CPU when ``use_cpu``; the XLA device when ``use_xla``; CUDA (``cuda:<local_rank>``);
    Intel XPU; Apple MPS (single process only); CPU.

    Args:
        layout: The process layout (its ``local_rank`` picks the GPU).
        use_cpu: Force the CPU even when an accelerator is present.
        use_xla: Use torch_xla's device.

    Raises:
        DeviceSelectionError: XLA requested without torch_xla, or more local processes than GPUs.

    """
    if use_cpu:
        return torch.device("cpu")
    if use_xla:
        if not torch_xla_available():
            raise DeviceSelectionError(
                "An XLA device was requested but torch_xla is not installed; "
                "install the 'xla' extra (pip install 'accel-state[xla]')."
            )
        import torch_xla

        return torch.device(torch_xla.device())
    if torch.cuda.is_available():
        return _indexed_device("cuda", torch.cuda.device_count(), layout, torch.cuda.set_device)
    if xpu_available():
        return _indexed_device("xpu", torch.xpu.device_count(), layout, torch.xpu.set_device)
    if mps_available() and layout.world_size == 1:
        return torch.device("mps")
    return torch.device("cpu")


def use_named_device(name: str) -> torch.device:
    """The device called ``name`` (``ACCELERATE_TORCH_DEVICE``), made current where that applies.

    Raises:
        DeviceSelectionError: ``name`` is not a device torch knows.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as error:
        raise DeviceSelectionError(
            f"ACCELERATE_TORCH_DEVICE={name!r} is not a torch device ({error}); use a name such "
            "as 'cuda:0', 'xpu:1' or 'cpu', or unset it to let accel choose."
        ) from None
    module = getattr(torch, device.type, None)
    set_device = getattr(module, "set_device", None)
    if device.type not in ("cpu", "meta") and callable(set_device):
        set_device(device)
    return device


def _indexed_device(
    kind: str, count: int, layout: ProcessLayout, set_device: object
) -> torch.device:
    if layout.local_world_size > count:
        raise DeviceSelectionError(
            f"{layout.local_world_size} processes on this machine but only {count} {kind} "
            f"device(s) are visible; launch at most {count} processes per machine or pass --cpu."
        )
    device = torch.device(kind, layout.local_rank)
    if callable(set_device):
        set_device(device)
    return device


def available_backends() -> list[str]:
    """Communication backends usable in this interpreter."""
    backends = ["gloo"] if dist.is_available() and dist.is_gloo_available() else []
    if dist.is_available() and dist.is_nccl_available() and torch.cuda.is_available():
        backends.append("nccl")
    if dist.is_available() and dist.is_mpi_available():
        backends.append("mpi")
    if importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
        backends.append("ccl")
    if xpu_available():
        backends.append("xccl")
    if torch_xla_available():
        backends.append("xla")
    return backends


def default_backend(device: torch.device) -> str:
    """The natural backend for a device: nccl for CUDA, xla for XLA, xccl for XPU, else gloo."""
    return {"cuda": "nccl", "xla": "xla", "xpu": "xccl"}.get(device.type, "gloo")


def select_backend(device: torch.device, requested: str | None = None) -> str:
    """Return the backend to start the process group with.

    Args:
        device: This process's device.
        requested: A backend asked for explicitly (argument or ``ACCEL_BACKEND``), or ``None``.

    Raises:
        DeviceSelectionError: The requested backend is not available or cannot drive ``device``.

    """
    backend = requested or default_backend(device)
    if backend == "ccl" and importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
        import oneccl_bindings_for_pytorch  # noqa: F401  (registers the backend)
    available = available_backends()
    if backend not in available:
        raise DeviceSelectionError(
            f"backend={backend!r} is not available here (available: {', '.join(available) or 'none'}); "
            "pick one of those with ACCEL_BACKEND or the backend argument."
        )
    incompatible = {"nccl": "cuda", "xla": "xla", "xccl": "xpu"}
    needed = incompatible.get(backend)
    if needed is not None and device.type != needed:
        raise DeviceSelectionError(
            f"backend={backend!r} needs a {needed} device but this process uses {device}; "
            f"use backend='gloo' on {device.type}."
        )
    return backend
