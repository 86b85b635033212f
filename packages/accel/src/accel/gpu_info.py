"""GPU facts read without initialising CUDA (``nvidia-smi``), and which libraries are imported.

Accelerate's ``accelerate.utils.environment`` helpers of the same names.

Example:
    >>> from accel.utils import are_libraries_initialized
    >>> are_libraries_initialized("torch", "not_a_library")
    ['torch']
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from torch.torch_version import TorchVersion

#: Consumer GPUs whose NCCL peer-to-peer / InfiniBand paths need driver 550.40.07 or newer.
_P2P_RESTRICTED = ("RTX 40",)
_P2P_DRIVER = "550.40.07"


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among ``library_names`` that are imported in this process."""
    return [name for name in library_names if name in sys.modules]


def _nvidia_smi(*query: str) -> list[str]:
    """Rows of ``nvidia-smi --query-gpu=<query> --format=csv,noheader``.

    Raises:
        FileNotFoundError: ``nvidia-smi`` is not on PATH (no NVIDIA driver).
    """
    command = shutil.which("nvidia-smi")
    if command is None:
        raise FileNotFoundError(
            "nvidia-smi is not on PATH: no NVIDIA driver on this machine, so no GPU to describe."
        )
    output = subprocess.check_output(
        [command, f"--query-gpu={','.join(query)}", "--format=csv,noheader"], text=True
    )
    return [row for row in output.strip().split(os.linesep) if row]


def get_gpu_info() -> tuple[list[str], int]:
    """``(GPU names, GPU count)`` from ``nvidia-smi`` (CUDA is not initialised).

    Raises:
        FileNotFoundError: No ``nvidia-smi`` (no NVIDIA driver).
    """
    rows = _nvidia_smi("count", "name")
    return [row.split(",", 1)[1].strip() for row in rows], len(rows)


def get_driver_version() -> str:
    """The NVIDIA driver version (of the first GPU) from ``nvidia-smi``, e.g. ``"550.54.15"``.

    Raises:
        FileNotFoundError: No ``nvidia-smi`` (no NVIDIA driver).
    """
    return _nvidia_smi("driver_version")[0].strip()


def check_cuda_p2p_ib_support() -> bool:
    """Whether NCCL may use peer-to-peer and InfiniBand between this machine's GPUs.

    ``False`` only for several consumer RTX 40xx GPUs on a driver older than 550.40.07 (set
    ``NCCL_P2P_DISABLE=1`` and ``NCCL_IB_DISABLE=1`` then); ``True`` otherwise, including when
    there is no GPU or ``nvidia-smi`` cannot be read.
    """
    try:
        names, count = get_gpu_info()
        if count > 1 and any(tag in name for name in names for tag in _P2P_RESTRICTED):
            return bool(TorchVersion(get_driver_version()) >= _P2P_DRIVER)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        pass
    return True


__all__ = [
    "are_libraries_initialized",
    "check_cuda_p2p_ib_support",
    "get_driver_version",
    "get_gpu_info",
]
