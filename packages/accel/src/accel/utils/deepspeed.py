"""Accelerate's ``accelerate.utils.deepspeed`` module path: a door to :mod:`accel.strategies.deepspeed.plugin`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.errors import (
    AcceleratorConfigError as AcceleratorConfigError,
)
from accel.errors import (
    UnsupportedFeatureError as UnsupportedFeatureError,
)
from accel.patch_forwarding import serve_as_door
from accel.scheduler import (
    AcceleratedScheduler as AcceleratedScheduler,
)
from accel.strategies.deepspeed.hf_config import (
    HfDeepSpeedConfig as HfDeepSpeedConfig,
)
from accel.strategies.deepspeed.plugin import (
    FIELD_KEYS as FIELD_KEYS,
)
from accel.strategies.deepspeed.plugin import (
    DeepSpeedEngineWrapper as DeepSpeedEngineWrapper,
)
from accel.strategies.deepspeed.plugin import (
    DeepSpeedPlugin as DeepSpeedPlugin,
)
from accel.strategies.deepspeed.plugin import (
    DeepSpeedSchedulerWrapper as DeepSpeedSchedulerWrapper,
)
from accel.strategies.deepspeed.plugin import (
    DummyOptim as DummyOptim,
)
from accel.strategies.deepspeed.plugin import (
    DummyScheduler as DummyScheduler,
)
from accel.strategies.deepspeed.plugin import (
    get_active_deepspeed_plugin as get_active_deepspeed_plugin,
)
from accel.strategies.deepspeed.plugin import (
    import_deepspeed as import_deepspeed,
)
from accel.strategies.deepspeed.plugin import (
    load_config_file as load_config_file,
)
from accel.strategies.deepspeed.plugin import (
    require_deepspeed as require_deepspeed,
)

serve_as_door(__name__, "accel.strategies.deepspeed.plugin")
