"""``ProfileKwargs``: ``torch.profiler`` settings for ``Accelerator.profile``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.kwargs_handlers import KwargsHandler

#: File name of each rank's Chrome trace inside ``output_trace_dir``.
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

_ACTIVITIES = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "xpu": "XPU",
    "mtia": "MTIA",
    "hpu": "HPU",
}


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments for ``torch.profiler.profile``.

    Args:
        activities: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mtia"``, ``"hpu"``; default: torch's.
        schedule_option: ``torch.profiler.schedule`` arguments (``wait``, ``warmup``, ``active``,
            ``repeat``, ``skip_first``); call ``prof.step()`` each iteration.
        on_trace_ready: Called with the profiler when a scheduled cycle ends.
        record_shapes: Record input shapes.
        profile_memory: Track tensor memory.
        with_stack: Record source locations.
        with_flops: Estimate FLOPs of matrix multiplications and convolutions.
        with_modules: Record the module hierarchy (TorchScript only).
        output_trace_dir: Folder where each rank writes ``profile_<rank>.json`` (Chrome trace).
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | os.PathLike[str] | None = None

    def _activities(self) -> list[torch.profiler.ProfilerActivity] | None:
        if self.activities is None:
            return None
        chosen = []
        for name in self.activities:
            member = _ACTIVITIES.get(str(name).lower())
            if member is None or not hasattr(torch.profiler.ProfilerActivity, member):
                raise AcceleratorConfigError(
                    f"ProfileKwargs(activities=[..., {name!r}, ...]): use some of "
                    f"{sorted(_ACTIVITIES)}."
                )
            chosen.append(getattr(torch.profiler.ProfilerActivity, member))
        return chosen

    def build(self) -> torch.profiler.profile:
        """A ``torch.profiler.profile`` configured with these settings."""
        schedule = None
        if self.schedule_option is not None:
            schedule = torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=self._activities(),
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )

    def trace_path(self, process_index: int) -> str | None:
        """Where ``process_index`` writes its trace, or None without ``output_trace_dir``."""
        if self.output_trace_dir is None:
            return None
        return os.path.join(
            self.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=process_index)
        )
