"""Context parallelism: torch's ``context_parallel`` (ring attention) over the mesh's ``cp`` dimension.

Inside :func:`context_parallel_block` the given buffers (inputs, labels, position ids...) are
split along their sequence dimension across the ``cp`` ranks and
``torch.nn.functional.scaled_dot_product_attention`` exchanges keys and values around the ring.
FSDP2 shards parameters over ``dp_shard_cp``, so gradients are averaged over the ``cp`` ranks too.

torch 2.13 runs it on CUDA only: its ring attention dispatches the flash / memory-efficient /
cuDNN SDPA kernels, and the CPU flash-attention kernel has no sharding strategy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from accel.errors import UnsupportedFeatureError

CPU_REASON = (
    "context parallelism (cp_size={cp}) runs torch's context_parallel, whose ring attention "
    "only has CUDA kernels in torch {version} (the CPU flash-attention kernel has no sharding "
    "strategy), and this job runs on {device}. Run it on CUDA GPUs, or set cp_size=1."
)


def check_device(device: torch.device, cp_size: int) -> None:
    """Refuse context parallelism on a device torch's ring attention does not run on.

    Raises:
        UnsupportedFeatureError: ``device`` is not a CUDA device (the message says why).
    """
    if device.type != "cuda":
        raise UnsupportedFeatureError(
            CPU_REASON.format(cp=cp_size, version=torch.__version__, device=device.type)
        )


@contextlib.contextmanager
def context_parallel_block(
    cp_mesh: Any,
    comm_strategy: str,
    buffers: Iterable[torch.Tensor] | None = None,
    buffer_seq_dims: Iterable[int] | None = None,
    no_restore_buffers: Iterable[torch.Tensor] | None = None,
) -> Iterator[None]:
    """Split ``buffers`` over ``cp_mesh`` for the block and run attention as a ring.

    Args:
        cp_mesh: The mesh's ``cp`` dimension.
        comm_strategy: ``"allgather"`` or ``"alltoall"`` (``TorchContextParallelConfig``).
        buffers: Tensors sharded in place along their sequence dimension for the block.
        buffer_seq_dims: The sequence dimension of each buffer (default 1 for every one).
        no_restore_buffers: Buffers left sharded after the block (e.g. labels used only inside).
    """
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    tensors = list(buffers or [])
    dims = list(buffer_seq_dims) if buffer_seq_dims is not None else [1] * len(tensors)
    set_rotate_method(comm_strategy)
    with context_parallel(
        cp_mesh,
        buffers=tensors,
        buffer_seq_dims=dims,
        no_restore_buffers=set(no_restore_buffers or ()),
    ):
        yield
