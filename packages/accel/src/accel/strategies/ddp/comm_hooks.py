"""DDP communication hooks chosen by ``DistributedDataParallelKwargs(comm_hook=..., ...)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from accel.errors import AcceleratorConfigError
from accel.kwargs_handlers import DDPCommunicationHookType

COMM_HOOK_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


def require_numpy_for(kind: DDPCommunicationHookType) -> None:
    """Refuse a PowerSGD hook when numpy is missing: torch's PowerSGD state imports it.

    Raises:
        AcceleratorConfigError: numpy is not installed (torch does not depend on it).
    """
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise AcceleratorConfigError(
            f"DistributedDataParallelKwargs(comm_hook={kind.value!r}): torch's PowerSGD hook "
            "needs numpy, which is not installed. Install it (pip install numpy), or use "
            "comm_hook='fp16' or 'bf16', which do not."
        ) from None


@dataclasses.dataclass
class CommHook:
    """One hook choice; :meth:`register` installs it on a DDP model (nothing for ``"no"``)."""

    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def chosen(self) -> bool:
        """Whether a hook was asked for (anything but ``"no"``)."""
        return DDPCommunicationHookType(self.comm_hook) != DDPCommunicationHookType.NO

    def register(self, model: DistributedDataParallel) -> None:
        """Register the hook (and its state) on ``model``."""
        kind = DDPCommunicationHookType(self.comm_hook)
        if kind == DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        state: Any = None
        hook: Callable[..., Any]
        if kind == DDPCommunicationHookType.FP16:
            hook = default_hooks.fp16_compress_hook
        elif kind == DDPCommunicationHookType.BF16:
            hook = default_hooks.bf16_compress_hook
        else:
            require_numpy_for(kind)
            state = powerSGD_hook.PowerSGDState(process_group=None, **self.comm_state_option)
            hook = (
                powerSGD_hook.powerSGD_hook
                if kind == DDPCommunicationHookType.POWER_SGD
                else powerSGD_hook.batched_powerSGD_hook
            )
        wrapper = DDPCommunicationHookType(self.comm_wrapper)
        if wrapper == DDPCommunicationHookType.FP16:
            hook = default_hooks.fp16_compress_wrapper(hook)
        elif wrapper == DDPCommunicationHookType.BF16:
            hook = default_hooks.bf16_compress_wrapper(hook)
        model.register_comm_hook(state, hook)
