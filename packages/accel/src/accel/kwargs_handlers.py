"""Small dataclasses that forward keyword arguments to the objects the Accelerator creates."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

from accel.errors import AcceleratorConfigError
from accel_state import LaunchContract


@dataclasses.dataclass
class KwargsHandler:
    """Base class: :meth:`to_kwargs` returns only the fields changed from their defaults."""

    def _default_instance(self) -> KwargsHandler:
        """The handler as built with no arguments, which ``to_kwargs`` compares against."""
        return type(self)()

    def to_kwargs(self) -> dict[str, Any]:
        """The non-default fields as a dictionary."""
        defaults = self._default_instance()
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(defaults, field.name)
        }


class DDPCommunicationHookType(str, enum.Enum):
    """Gradient communication hooks for DDP: compression or PowerSGD (see ``comm_hook``)."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


_POWER_SGD_HOOKS = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
_COMM_HOOK_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel`` and its communication hook.

    Args:
        comm_hook: Gradient all-reduce hook: ``"fp16"``/``"bf16"`` compression, ``"power_sgd"``
            or ``"batched_power_sgd"`` (low-rank), ``"no"`` for plain all-reduce.
        comm_wrapper: ``"fp16"``/``"bf16"``: compress what a PowerSGD hook sends.
        comm_state_option: Keyword arguments of ``PowerSGDState``
            (e.g. ``matrix_approximation_rank``, ``start_powerSGD_iter``).
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("comm_hook", "comm_wrapper"):
            value = getattr(self, name)
            try:
                setattr(self, name, DDPCommunicationHookType(value))
            except ValueError:
                raise AcceleratorConfigError(
                    f"DistributedDataParallelKwargs({name}={value!r}): use one of "
                    f"{[kind.value for kind in DDPCommunicationHookType]}."
                ) from None
        if self.comm_wrapper not in (
            DDPCommunicationHookType.NO,
            DDPCommunicationHookType.FP16,
            DDPCommunicationHookType.BF16,
        ):
            raise AcceleratorConfigError(
                f"DistributedDataParallelKwargs(comm_wrapper={self.comm_wrapper.value!r}): "
                "a wrapper compresses with 'fp16' or 'bf16'."
            )
        if (
            self.comm_wrapper != DDPCommunicationHookType.NO
            and self.comm_hook not in _POWER_SGD_HOOKS
        ):
            raise AcceleratorConfigError(
                f"DistributedDataParallelKwargs(comm_wrapper={self.comm_wrapper.value!r}) wraps a "
                f"PowerSGD hook, but comm_hook={self.comm_hook.value!r}; set comm_hook='power_sgd'."
            )
        if self.comm_state_option and self.comm_hook not in _POWER_SGD_HOOKS:
            raise AcceleratorConfigError(
                "DistributedDataParallelKwargs(comm_state_option=...) configures PowerSGD, but "
                f"comm_hook={self.comm_hook.value!r}; set comm_hook='power_sgd' or drop the option."
            )

    def ddp_kwargs(self) -> dict[str, Any]:
        """The changed arguments of the DDP constructor (the hook settings left out)."""
        return {k: v for k, v in self.to_kwargs().items() if k not in _COMM_HOOK_FIELDS}

    def comm_hook_settings(self) -> dict[str, Any]:
        """The hook settings, for the DDP strategy to register after wrapping."""
        return {name: getattr(self, name) for name in _COMM_HOOK_FIELDS}


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


class DynamoBackend(str, enum.Enum):
    """``torch.compile`` backends by Accelerate's names (``NO`` disables compilation).

    Prints as its value (``str(DynamoBackend.INDUCTOR) == "INDUCTOR"``), as in Accelerate.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)

    @classmethod
    def list(cls) -> list[str]:
        """Return the values of all members."""
        return [str(member.value) for member in cls]

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


@dataclasses.dataclass
class TorchDynamoPlugin(KwargsHandler):
    """Settings for ``torch.compile`` (``backend="no"`` or ``disable=True`` turns it off).

    A setting left ``None`` comes from the launcher (``accel launch --dynamo_backend ...``):
    the ``ACCEL_DYNAMO_*`` variables, or Accelerate's ``ACCELERATE_DYNAMO_*``, read through
    :class:`accel_state.contract.LaunchContract`; without them, the defaults below.

    Args:
        backend: A backend name or :class:`DynamoBackend` (stored lower-case; default ``"no"``).
        mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"``...
        fullgraph: Fail instead of splitting the graph (default False).
        dynamic: Dynamic shapes (``None``: torch decides).
        options: Backend options (``torch.compile(options=...)``).
        disable: Keep models eager even when a backend is set.
        use_regional_compilation: Compile each block of repeated layers (``nn.ModuleList``
            entries) instead of the whole model: much faster to compile, nearly as fast to run
            (default False).
    """

    backend: str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        unset = (self.backend, self.mode, self.fullgraph, self.dynamic)
        self._fill_unset_from(
            LaunchContract.from_env()
            if None in unset or self.use_regional_compilation is None
            else LaunchContract()
        )

    def _default_instance(self) -> TorchDynamoPlugin:
        """The defaults without any launcher setting, so the launcher's show in ``to_kwargs``."""
        plain = TorchDynamoPlugin.__new__(TorchDynamoPlugin)
        for field in dataclasses.fields(TorchDynamoPlugin):
            setattr(plain, field.name, field.default)
        plain._fill_unset_from(LaunchContract())
        return plain

    def _fill_unset_from(self, contract: LaunchContract) -> None:
        """Give the fields left ``None`` the launcher's settings in ``contract``."""
        backend: Any = contract.dynamo_backend if self.backend is None else self.backend
        if isinstance(backend, DynamoBackend):
            backend = backend.value
        self.backend = str(backend or "no").lower()
        if self.mode is None:
            self.mode = contract.dynamo_mode
        if self.dynamic is None:
            self.dynamic = contract.dynamo_use_dynamic
        self.fullgraph = bool(
            contract.dynamo_use_fullgraph if self.fullgraph is None else self.fullgraph
        )
        self.use_regional_compilation = bool(
            contract.dynamo_use_regional_compilation
            if self.use_regional_compilation is None
            else self.use_regional_compilation
        )

    @property
    def enabled(self) -> bool:
        """Whether prepared models are compiled."""
        return self.backend != "no" and not self.disable

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph}
        if self.mode is not None:
            kwargs["mode"] = self.mode
        if self.dynamic is not None:
            kwargs["dynamic"] = self.dynamic
        if self.options is not None:
            kwargs["options"] = self.options
        return kwargs
