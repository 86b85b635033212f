"""Processes driven by torch_xla's PJRT runtime (TPU, or XLA on CPU/GPU)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from accel_state.cluster.base import ClusterEnvironment, ProcessLayout
from accel_state.errors import EnvironmentConfigError


def torch_xla_available() -> bool:
    """Whether torch_xla can be imported (without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


class XLAEnvironment(ClusterEnvironment):
    """Layout reported by ``torch_xla.runtime``; applies when ``PJRT_DEVICE`` is set."""

    name = "xla"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """True when ``PJRT_DEVICE`` is set (torch_xla's runtime is then asked for the layout)."""
        return bool(environ.get("PJRT_DEVICE"))

    @classmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Ask torch_xla's runtime for ordinals and sizes.

        Raises:
            EnvironmentConfigError: ``PJRT_DEVICE`` is set but torch_xla is not installed.

        """
        if not torch_xla_available():
            raise EnvironmentConfigError(
                f"PJRT_DEVICE={environ.get('PJRT_DEVICE')!r} asks for XLA but torch_xla is not "
                "installed; install the 'xla' extra (pip install 'accel-state[xla]') or unset "
                "PJRT_DEVICE."
            )
        import torch_xla.runtime as xr

        world_size = int(xr.world_size())
        local_world_size = int(getattr(xr, "local_process_count", lambda: world_size)())
        rank = int(xr.global_ordinal())
        return ProcessLayout(
            rank=rank,
            local_rank=int(xr.local_ordinal()),
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=rank // max(1, local_world_size),
            num_nodes=max(1, world_size // max(1, local_world_size)),
            source=cls.name,
        )
