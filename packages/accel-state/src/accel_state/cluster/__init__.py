"""Cluster-environment detection: one class per launcher, tried in one fixed order."""

from __future__ import annotations

import os
from collections.abc import Mapping

from accel_state.cluster.base import ClusterEnvironment, ProcessLayout
from accel_state.cluster.local import LocalEnvironment
from accel_state.cluster.mpi import MPICHEnvironment, OpenMPIEnvironment
from accel_state.cluster.slurm import SlurmEnvironment
from accel_state.cluster.torchelastic import TorchElasticEnvironment
from accel_state.cluster.xla import XLAEnvironment

#: Resolution order: explicit torchrun variables win over the scheduler's, which win over the
#: XLA runtime; a plain process is the fallback.
CLUSTER_ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    TorchElasticEnvironment,
    SlurmEnvironment,
    OpenMPIEnvironment,
    MPICHEnvironment,
    XLAEnvironment,
    LocalEnvironment,
)


def resolve_cluster_environment(
    environ: Mapping[str, str] | None = None,
) -> type[ClusterEnvironment]:
    """Return the first environment class in :data:`CLUSTER_ENVIRONMENTS` that detects itself."""
    env = os.environ if environ is None else environ
    for candidate in CLUSTER_ENVIRONMENTS:
        if candidate.detect(env):
            return candidate
    return LocalEnvironment


def detect_layout(environ: Mapping[str, str] | None = None) -> ProcessLayout:
    """Resolve the cluster environment and read this process's layout from it."""
    env = os.environ if environ is None else environ
    return resolve_cluster_environment(env).layout(env)


__all__ = [
    "CLUSTER_ENVIRONMENTS",
    "ClusterEnvironment",
    "LocalEnvironment",
    "MPICHEnvironment",
    "OpenMPIEnvironment",
    "ProcessLayout",
    "SlurmEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "detect_layout",
    "resolve_cluster_environment",
]
