"""``DataLoaderConfiguration``: the dataloader options an Accelerator (or a library) passes around."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class DataLoaderConfiguration:
    """How dataloaders are sharded across processes.

    Args:
        split_batches: Split each batch of the original dataloader between the processes (the
            total batch size stays what the dataloader says) instead of giving each process whole
            batches (the total batch size is ``batch_size * num_processes``).
        dispatch_batches: Let the main process read every batch and send each process its slice.
            ``None``: on for iterable datasets, off otherwise.
        even_batches: Complete the last round by wrapping around to the first samples so every
            process gets the same number of batches; ``False`` leaves an uneven tail.
        use_seedable_sampler: Replace a ``RandomSampler`` by :class:`SeedableRandomSampler`
            (the order depends only on the seed and the epoch).
        data_seed: Seed of the seedable sampler (default: agreed from the main process's torch seed).
        non_blocking: Copy batches to the device asynchronously (useful with ``pin_memory=True``).
        use_stateful_dataloader: Accepted for Accelerate compatibility. Prepared dataloaders always
            have ``state_dict()`` / ``load_state_dict()``; torchdata is not needed.

    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False

    def to_kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments of :func:`accel_data.prepare_data_loader`."""
        return dataclasses.asdict(self)
