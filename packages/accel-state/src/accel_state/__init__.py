"""accel-state: who am I, where am I, which device and backend.

Example:
    >>> from accel_state import PartialState
    >>> state = PartialState()
    >>> state.print(f"{state.distributed_type}: rank {state.process_index} of {state.num_processes}")

Names are imported on first use, so ``accel_state.contract``, ``accel_state.types`` and
``accel_state.envvars`` can be used (by a launcher, say) without importing torch.

"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from accel_state.__about__ import __version__

_EXPORTS: dict[str, str] = {
    "CLUSTER_ENVIRONMENTS": "accel_state.cluster",
    "ClusterEnvironment": "accel_state.cluster",
    "LocalEnvironment": "accel_state.cluster",
    "MPICHEnvironment": "accel_state.cluster",
    "OpenMPIEnvironment": "accel_state.cluster",
    "ProcessLayout": "accel_state.cluster",
    "SlurmEnvironment": "accel_state.cluster",
    "TorchElasticEnvironment": "accel_state.cluster",
    "XLAEnvironment": "accel_state.cluster",
    "detect_layout": "accel_state.cluster",
    "resolve_cluster_environment": "accel_state.cluster",
    "LaunchContract": "accel_state.contract",
    "available_backends": "accel_state.device",
    "select_backend": "accel_state.device",
    "select_device": "accel_state.device",
    "patch_environment": "accel_state.envvars",
    "str_to_bool": "accel_state.envvars",
    "AccelStateError": "accel_state.errors",
    "DeviceSelectionError": "accel_state.errors",
    "EnvironmentConfigError": "accel_state.errors",
    "ProcessGroupError": "accel_state.errors",
    "StateConflictError": "accel_state.errors",
    "GradientState": "accel_state.gradient_state",
    "PartialState": "accel_state.partial_state",
    "reset_state": "accel_state.shared",
    "snapshot": "accel_state.shared",
    "ComputeEnvironment": "accel_state.types",
    "DistributedType": "accel_state.types",
    "PrecisionType": "accel_state.types",
    "RNGType": "accel_state.types",
}

__all__ = ["__version__", *sorted(_EXPORTS)]

if TYPE_CHECKING:
    from accel_state.cluster import (
        CLUSTER_ENVIRONMENTS,
        ClusterEnvironment,
        LocalEnvironment,
        MPICHEnvironment,
        OpenMPIEnvironment,
        ProcessLayout,
        SlurmEnvironment,
        TorchElasticEnvironment,
        XLAEnvironment,
        detect_layout,
        resolve_cluster_environment,
    )
    from accel_state.contract import LaunchContract
    from accel_state.device import available_backends, select_backend, select_device
    from accel_state.envvars import patch_environment, str_to_bool
    from accel_state.errors import (
        AccelStateError,
        DeviceSelectionError,
        EnvironmentConfigError,
        ProcessGroupError,
        StateConflictError,
    )
    from accel_state.gradient_state import GradientState
    from accel_state.partial_state import PartialState
    from accel_state.shared import reset_state, snapshot
    from accel_state.types import ComputeEnvironment, DistributedType, PrecisionType, RNGType


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_state' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
