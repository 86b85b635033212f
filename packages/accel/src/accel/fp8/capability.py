"""Whether this process can run fp8 matmuls, and whether an fp8 library can be imported.

Every fp8 backend asks these up front, so a job that cannot train in fp8 is refused when the
``Accelerator`` is created, with the reason and the fix, never silently run in bf16.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

import torch

from accel.errors import UnsupportedFeatureError

#: First CUDA compute capability with fp8 tensor cores (Ada Lovelace, SM 8.9; Hopper is 9.0).
CUDA_FP8_CAPABILITY = (8, 9)


def check_cuda_fp8_capability() -> bool:
    """Whether the current CUDA device has fp8 tensor cores (compute capability 8.9 or newer).

    ``False`` when no CUDA device is available.
    """
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability() >= CUDA_FP8_CAPABILITY


@functools.cache
def cpu_scaled_mm_works() -> bool:
    """Whether this torch build runs ``torch._scaled_mm`` on float8 tensors on the CPU."""
    scaled_mm = getattr(torch, "_scaled_mm", None)
    float8 = getattr(torch, "float8_e4m3fn", None)
    if scaled_mm is None or float8 is None:
        return False
    try:
        a = torch.ones(16, 16).to(float8)
        b = torch.ones(16, 16).to(float8).t()
        one = torch.ones(())
        out = scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return bool(out[0, 0].item() == 16.0)


def fp8_device_problem(device: torch.device, *, emulate: bool = False) -> str | None:
    """Why ``device`` cannot run fp8 matmuls, or ``None`` when it can.

    Args:
        device: The process's device.
        emulate: The backend emulates fp8 in higher precision (no fp8 kernels needed).
    """
    if emulate:
        return None
    if device.type == "cuda":
        if check_cuda_fp8_capability():
            return None
        capability = ".".join(map(str, torch.cuda.get_device_capability(device)))
        return (
            f"the GPU {torch.cuda.get_device_name(device)!r} has compute capability "
            f"{capability}; fp8 matmuls need 8.9 or newer (Ada, Hopper, Blackwell)"
        )
    if device.type == "cpu":
        if cpu_scaled_mm_works():
            return None
        return f"torch {torch.__version__} has no CPU kernel for torch._scaled_mm on float8"
    return f"fp8 matmuls are not supported on {device.type} devices"


def installed_version(module: str, distribution: str) -> str | None:
    """The installed version of ``distribution`` when ``module`` can be imported, else ``None``."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def require_package(module: str, distribution: str, backend: str, install: str) -> str:
    """The installed version of an fp8 library, or a refusal naming the install command.

    Raises:
        UnsupportedFeatureError: ``module`` cannot be imported.
    """
    version = installed_version(module, distribution)
    if version is None:
        raise UnsupportedFeatureError(
            f"mixed_precision='fp8' with the {backend} backend needs {distribution}, which is not "
            f"installed: {install}. (accel does not fall back to bf16 silently; pass "
            "mixed_precision='bf16' to train without fp8.)"
        )
    return version


__all__ = [
    "CUDA_FP8_CAPABILITY",
    "check_cuda_fp8_capability",
    "cpu_scaled_mm_works",
    "fp8_device_problem",
    "installed_version",
    "require_package",
]
