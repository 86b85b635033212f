"""Small dataclasses that forward keyword arguments to the objects the Accelerator creates."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Literal


@dataclasses.dataclass
class KwargsHandler:
    """Base class: :meth:`to_kwargs` returns only the fields changed from their defaults."""

    def to_kwargs(self) -> dict[str, Any]:
        """The non-default fields as a dictionary."""
        defaults = type(self)()
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(defaults, field.name)
        }


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel``."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for ``torch.amp.GradScaler`` (fp16 training)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for starting the process group: backend and timeout."""

    backend: str | None = None
    init_method: str | None = None
    timeout: datetime.timedelta | None = None


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for ``torch.autocast``."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclasses.dataclass
class TorchDynamoPlugin(KwargsHandler):
    """Settings for ``torch.compile`` (``backend="no"`` disables it)."""

    backend: str = "no"
    mode: Literal["default", "reduce-overhead", "max-autotune"] | None = None
    fullgraph: bool = False
    dynamic: bool | None = None

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph}
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        return kwargs
