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
    "ParallelMesh": "accel_state.device_mesh",
    "active_parallel_mesh": "accel_state.device_mesh",
    "patch_environment": "accel_state.envvars",
    "str_to_bool": "accel_state.envvars",
    "AccelStateError": "accel_state.errors",
    "DeviceSelectionError": "accel_state.errors",
    "EnvironmentConfigError": "accel_state.errors",
    "ParallelismConfigError": "accel_state.errors",
    "ProcessGroupError": "accel_state.errors",
    "StateConflictError": "accel_state.errors",
    "PartialStateResetError": "accel_state.errors",
    "TorchFeatureError": "accel_state.errors",
    "GradientState": "accel_state.gradient_state",
    "PartialState": "accel_state.partial_state",
    "DeepSpeedSequenceParallelConfig": "accel_state.parallelism_config",
    "ParallelismConfig": "accel_state.parallelism_config",
    "TorchContextParallelConfig": "accel_state.parallelism_config",
    "TorchTensorParallelConfig": "accel_state.parallelism_config",
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
        CLUSTER_ENVIRONMENTS as CLUSTER_ENVIRONMENTS,
    )
    from accel_state.cluster import (
        ClusterEnvironment as ClusterEnvironment,
    )
    from accel_state.cluster import (
        LocalEnvironment as LocalEnvironment,
    )
    from accel_state.cluster import (
        MPICHEnvironment as MPICHEnvironment,
    )
    from accel_state.cluster import (
        OpenMPIEnvironment as OpenMPIEnvironment,
    )
    from accel_state.cluster import (
        ProcessLayout as ProcessLayout,
    )
    from accel_state.cluster import (
        SlurmEnvironment as SlurmEnvironment,
    )
    from accel_state.cluster import (
        TorchElasticEnvironment as TorchElasticEnvironment,
    )
    from accel_state.cluster import (
        XLAEnvironment as XLAEnvironment,
    )
    from accel_state.cluster import (
        detect_layout as detect_layout,
    )
    from accel_state.cluster import (
        resolve_cluster_environment as resolve_cluster_environment,
    )
    from accel_state.contract import (
        LaunchContract as LaunchContract,
    )
    from accel_state.device import (
        available_backends as available_backends,
    )
    from accel_state.device import (
        select_backend as select_backend,
    )
    from accel_state.device import (
        select_device as select_device,
    )
    from accel_state.device_mesh import (
        ParallelMesh as ParallelMesh,
    )
    from accel_state.device_mesh import (
        active_parallel_mesh as active_parallel_mesh,
    )
    from accel_state.envvars import (
        patch_environment as patch_environment,
    )
    from accel_state.envvars import (
        str_to_bool as str_to_bool,
    )
    from accel_state.errors import (
        AccelStateError as AccelStateError,
    )
    from accel_state.errors import (
        DeviceSelectionError as DeviceSelectionError,
    )
    from accel_state.errors import (
        EnvironmentConfigError as EnvironmentConfigError,
    )
    from accel_state.errors import (
        ParallelismConfigError as ParallelismConfigError,
    )
    from accel_state.errors import (
        PartialStateResetError as PartialStateResetError,
    )
    from accel_state.errors import (
        ProcessGroupError as ProcessGroupError,
    )
    from accel_state.errors import (
        StateConflictError as StateConflictError,
    )
    from accel_state.errors import (
        TorchFeatureError as TorchFeatureError,
    )
    from accel_state.gradient_state import (
        GradientState as GradientState,
    )
    from accel_state.parallelism_config import (
        DeepSpeedSequenceParallelConfig as DeepSpeedSequenceParallelConfig,
    )
    from accel_state.parallelism_config import (
        ParallelismConfig as ParallelismConfig,
    )
    from accel_state.parallelism_config import (
        TorchContextParallelConfig as TorchContextParallelConfig,
    )
    from accel_state.parallelism_config import (
        TorchTensorParallelConfig as TorchTensorParallelConfig,
    )
    from accel_state.partial_state import (
        PartialState as PartialState,
    )
    from accel_state.shared import (
        reset_state as reset_state,
    )
    from accel_state.shared import (
        snapshot as snapshot,
    )
    from accel_state.types import (
        ComputeEnvironment as ComputeEnvironment,
    )
    from accel_state.types import (
        DistributedType as DistributedType,
    )
    from accel_state.types import (
        PrecisionType as PrecisionType,
    )
    from accel_state.types import (
        RNGType as RNGType,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_state' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
