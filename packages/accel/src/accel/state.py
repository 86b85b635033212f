"""Accelerate's ``accelerate.state`` module path: a door to :mod:`accel.accelerator_state` and accel-state."""

from __future__ import annotations

from accel.accelerator_state import (
    AcceleratorState,
    is_initialized,
)
from accel.accelerator_state import (
    state_reset_error as state_reset_error,
)
from accel.env_values import (
    get_int_from_env,
)
from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.errors import (
    StateResetError as StateResetError,
)
from accel.errors import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.kwargs_handlers import (
    TorchDynamoPlugin as TorchDynamoPlugin,
)
from accel.patch_forwarding import serve_as_door
from accel.strategies.deepspeed.named_plugins import (
    DeepSpeedPluginsMixin as DeepSpeedPluginsMixin,
)
from accel.strategies.deepspeed.named_plugins import (
    refuse_plugins_for_existing_state as refuse_plugins_for_existing_state,
)
from accel.strategies.deepspeed.named_plugins import (
    split_deepspeed_plugins as split_deepspeed_plugins,
)
from accel_state import (
    DistributedType as DistributedType,
)
from accel_state import (
    GradientState,
    PartialState,
)
from accel_state import (
    ParallelismConfig as ParallelismConfig,
)
from accel_state import (
    PartialStateResetError as PartialStateResetError,
)
from accel_state import (
    PrecisionType as PrecisionType,
)
from accel_state.device_mesh import (
    ParallelMesh as ParallelMesh,
)
from accel_state.device_mesh import (
    activate as activate,
)
from accel_state.shared import (
    SharedDict,
    ThreadLocalSharedDict,
    do_nothing,
)
from accel_state.shared import (
    shared_dict as shared_dict,
)

__all__ = [
    "AcceleratorState",
    "GradientState",
    "PartialState",
    "SharedDict",
    "ThreadLocalSharedDict",
    "do_nothing",
    "get_int_from_env",
    "is_initialized",
]

serve_as_door(__name__, "accel.accelerator_state")
