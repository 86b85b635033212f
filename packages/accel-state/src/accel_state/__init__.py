"""accel-state: who am I, where am I, which device and backend.

Example:
    >>> from accel_state import PartialState
    >>> state = PartialState()
    >>> state.print(f"{state.distributed_type}: rank {state.process_index} of {state.num_processes}")
"""

from accel_state.__about__ import __version__
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

__all__ = [
    "CLUSTER_ENVIRONMENTS",
    "AccelStateError",
    "ClusterEnvironment",
    "ComputeEnvironment",
    "DeviceSelectionError",
    "DistributedType",
    "EnvironmentConfigError",
    "GradientState",
    "LaunchContract",
    "LocalEnvironment",
    "MPICHEnvironment",
    "OpenMPIEnvironment",
    "PartialState",
    "PrecisionType",
    "ProcessGroupError",
    "ProcessLayout",
    "RNGType",
    "SlurmEnvironment",
    "StateConflictError",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "__version__",
    "available_backends",
    "detect_layout",
    "patch_environment",
    "reset_state",
    "resolve_cluster_environment",
    "select_backend",
    "select_device",
    "snapshot",
    "str_to_bool",
]
