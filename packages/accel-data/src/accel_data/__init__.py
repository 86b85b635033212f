"""accel-data: sharded dataloaders, samplers, RNG synchronisation and exact resume for PyTorch.

Example:
    >>> from torch.utils.data import DataLoader
    >>> from accel_data import prepare_data_loader, set_seed
    >>> set_seed(0)
    >>> loader = prepare_data_loader(DataLoader(dataset, batch_size=16, shuffle=True))
    >>> for batch in loader:  # this process's share, same shuffle on every process
    ...     ...

"""

import os as _os

from accel_data.__about__ import __version__
from accel_data.config import DataLoaderConfiguration
from accel_data.dispatcher import DataLoaderDispatcher
from accel_data.errors import (
    AccelDataError,
    BatchSizeError,
    DataConfigurationError,
    DispatchError,
    ResumeStateError,
    RNGSyncError,
)
from accel_data.iterable import IterableDatasetShard
from accel_data.loader_base import DataLoaderStateMixin
from accel_data.prepare import prepare_data_loader
from accel_data.resume import SkipDataLoader, skip_first_batches
from accel_data.rng import set_seed, synchronize_rng_state, synchronize_rng_states
from accel_data.samplers import (
    BatchSamplerShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    get_sampler,
)
from accel_data.shard_loader import DataLoaderShard
from accel_data.shared_position import SharedPosition, SharedPositionLoader
from accel_data.xla_loader import MpDeviceLoaderWrapper
from accel_ops.records import register_internal_package

__all__ = [
    "__version__",
    # entry points
    "DataLoaderConfiguration",
    "prepare_data_loader",
    "skip_first_batches",
    "set_seed",
    "synchronize_rng_state",
    "synchronize_rng_states",
    # dataloaders
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "MpDeviceLoaderWrapper",
    "SkipDataLoader",
    "SharedPositionLoader",
    "SharedPosition",
    # samplers and datasets
    "BatchSamplerShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "get_sampler",
    # errors
    "AccelDataError",
    "BatchSizeError",
    "DataConfigurationError",
    "DispatchError",
    "ResumeStateError",
    "RNGSyncError",
]

# Collective records name the caller's line, skipping this package's frames.
register_internal_package(_os.path.dirname(_os.path.abspath(__file__)))
