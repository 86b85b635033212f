"""A plain process that nothing launched: rank 0 of 1."""

from __future__ import annotations

from collections.abc import Mapping

from accel_state.cluster.base import ClusterEnvironment, ProcessLayout


class LocalEnvironment(ClusterEnvironment):
    """The fallback: one process on one machine."""

    name = "local"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Always applies; tried last."""
        return True

    @classmethod
    def layout(cls, environ: Mapping[str, str]) -> ProcessLayout:
        """Rank 0 of a one-process job."""
        return ProcessLayout(source=cls.name)
