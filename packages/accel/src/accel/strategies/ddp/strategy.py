"""``DistributedDataParallel`` for multi-process CPU (gloo) and GPU (NCCL) jobs."""

from __future__ import annotations

import contextlib
import faulthandler
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from accel.run_config import RunConfig
from accel.strategies.base import ModelStrategy
from accel.strategies.ddp.buckets import SteadyBuckets
from accel.strategies.ddp.comm_hooks import COMM_HOOK_FIELDS, CommHook
from accel_state.group_keeper import GroupHolders

_RELEASE_WATCHDOG_SECONDS = 60.0
#: Key of the checkpoint manifest's metadata holding each model's DDP bucket layout.
DDP_BUCKETS_KEY = "ddp_buckets"


class DDPStrategy(ModelStrategy):
    """Wraps trainable models in DDP, which broadcasts rank 0's weights at construction.

    Settings are ``DistributedDataParallelKwargs`` fields. Without a communication hook of the
    user's (or ``static_graph``), DDP sums through :class:`SteadyBuckets`: bit for bit its own
    sum, and a resume that is exact on any number of processes.
    """

    name = "DistributedDataParallel"

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        settings = dict(config.ddp_settings)
        hook_settings = {name: settings.pop(name) for name in COMM_HOOK_FIELDS if name in settings}
        #: ``DistributedDataParallel`` arguments (the handler's fields but the comm hook's).
        self.settings = settings
        self.comm_hook = CommHook(**hook_settings)
        self._steady: dict[int, SteadyBuckets] = {}

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``model`` in DDP unless it has nothing to train or is already wrapped."""
        if isinstance(model, DistributedDataParallel):
            _WRAPPERS.add(model)
            return model
        if not any(parameter.requires_grad for parameter in model.parameters()):
            return model
        device = self.state.device
        device_ids = [device.index] if device.type in ("cuda", "xpu") else None
        wrapped = DistributedDataParallel(
            model,
            device_ids=device_ids,
            output_device=device_ids[0] if device_ids else None,
            **self.settings,
        )
        if self.comm_hook.chosen or wrapped.static_graph:
            self.comm_hook.register(wrapped)
        else:  # DDP's own sum, and a resumed first step in the saved run's buckets
            steady = SteadyBuckets(wrapped)
            steady.register()
            self._steady[id(wrapped)] = steady
        _WRAPPERS.add(wrapped)
        return wrapped

    @property
    def phases_without_waiting(self) -> frozenset[str]:
        """Not forward when a model broadcasts buffers (its ranks wait for rank 0's there)."""
        broadcasts = any(
            model.broadcast_buffers and any(True for _ in model.module.buffers())
            for model in (hook.model for hook in self._steady.values())
        )
        phases = super().phases_without_waiting
        return phases - {"forward"} if broadcasts else phases

    def gradients_ready_at(self) -> float | None:
        """When the last bucket of any DDP model was handed to accel's hook (None: no hook yet)."""
        moments = [hook.ready_at for hook in self._steady.values() if hook.ready_at]
        return max(moments) if moments else None

    def checkpoint_metadata(self, models: Sequence[torch.nn.Module]) -> dict[str, Any]:
        """Each DDP model's gradient buckets (:mod:`accel.strategies.ddp.buckets`)."""
        steady = [self._steady.get(id(model)) for model in models]
        layouts = [None if hook is None else hook.layout() for hook in steady]
        return {DDP_BUCKETS_KEY: layouts} if any(layouts) else {}

    def checkpoint_metadata_loaded(
        self, models: Sequence[torch.nn.Module], metadata: dict[str, Any]
    ) -> None:
        """A resumed run sums its first step in the buckets the saved run was using."""
        layouts = metadata.get(DDP_BUCKETS_KEY)
        if not isinstance(layouts, list) or len(layouts) != len(models):
            return
        for model, layout in zip(models, layouts, strict=True):
            steady = self._steady.get(id(model))
            if steady is not None and layout:
                steady.resume_in(layout)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The module inside a DDP wrapper."""
        if isinstance(model, (DistributedDataParallel, torch.nn.DataParallel)):
            return model.module  # type: ignore[no-any-return]
        return None

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """DDP's own ``no_sync`` for wrapped models."""
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()


def release_process_group(*models: DistributedDataParallel) -> None:
    """Drop DDP wrappers' references to their process group (reducer, logger, hooks, the group).

    A destroyed group lives on while a wrapper holds it, and so do its gloo worker threads; one
    that still releases a finished collective while the interpreter shuts down aborts the process
    ("terminate called without an active exception"). Freed here, the group joins its threads.
    The Python group object goes last: its destructor releases the GIL before joining, so a
    thread that needs the GIL can finish (the reducer's and logger's destructors keep the GIL and
    would deadlock there). The wrappers cannot run distributed steps afterwards; ``.module`` can.
    A GIL-free watchdog turns an unexpected hang into an exit with tracebacks after a minute.
    """
    holders = tuple(getattr(dist, kind) for kind in ("Reducer", "Logger") if hasattr(dist, kind))
    if not models:
        return
    # The process's own stderr: sys.stderr may be a stream without a file (captured output).
    stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    faulthandler.dump_traceback_later(_RELEASE_WATCHDOG_SECONDS, exit=True, file=stream)
    try:
        for model in models:
            for name, value in list(vars(model).items()):
                if name == "_comm_hooks" or isinstance(value, holders):
                    delattr(model, name)
        for model in models:
            for name, value in list(vars(model).items()):
                if isinstance(value, dist.ProcessGroup):
                    delattr(model, name)
    finally:
        faulthandler.cancel_dump_traceback_later()


# Every DDP wrapper this process made: detached from destroyed groups before they are freed.
_WRAPPERS = GroupHolders(lambda models: release_process_group(*models))
