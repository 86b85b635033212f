"""``AcceleratorState``: ``PartialState`` plus the training settings every Accelerator shares."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch

from accel.env_values import get_int_from_env
from accel.errors import AcceleratorConfigError, StateResetError, UnsupportedFeatureError
from accel.kwargs_handlers import TorchDynamoPlugin
from accel.strategies.deepspeed.named_plugins import (
    DeepSpeedPluginsMixin,
    refuse_plugins_for_existing_state,
    split_deepspeed_plugins,
)
from accel_state import (
    DistributedType,
    GradientState,
    ParallelismConfig,
    PartialState,
    PartialStateResetError,
    PrecisionType,
)
from accel_state.device_mesh import ParallelMesh, activate
from accel_state.shared import SharedDict, ThreadLocalSharedDict, do_nothing, shared_dict

F = TypeVar("F", bound=Callable[..., Any])

_DATA_PARALLEL_TYPES = (
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
)


def state_reset_error(name: str) -> StateResetError:
    """The error for reading the setting ``name`` after ``AcceleratorState._reset_state()``."""
    return StateResetError(
        f"`AcceleratorState` object has no attribute `{name}`. This happens if "
        "`AcceleratorState._reset_state()` (or accel_state.reset_state()) ran after this "
        "Accelerator was created: the settings it was made with are gone. Create a new "
        "Accelerator after the reset and use that one."
    )


def _surviving_partial_state() -> PartialState | None:
    """The process's :class:`PartialState` when it exists (a reset of ours keeps it), else None."""
    return PartialState() if PartialState._shared_state else None


class AcceleratorState(DeepSpeedPluginsMixin):
    """Process-wide training settings: precision, compilation, sharding plugins.

    Built on :class:`~accel_state.PartialState`, whose attributes it exposes as well.

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``; ``None`` keeps the launcher's.
        cpu: Force the CPU.
        dynamo_plugin: ``torch.compile`` settings.
        deepspeed_plugin: A :class:`~accel.DeepSpeedPlugin` (ZeRO settings), or a dict of named
            plugins (the first is selected; see :mod:`accel.strategies.deepspeed.named_plugins`).
        fsdp_plugin: A :class:`~accel.FullyShardedDataParallelPlugin`; without one, a job
            launched with FSDP gets one made from the launcher's settings.
        backend: Communication backend for the process group.
        timeout: Process-group timeout.
        parallelism_config: A :class:`~accel_state.ParallelismConfig`: its mesh is built here (on
            every rank) and becomes the job's (see :mod:`accel.parallelism`).
        torch_tp_plugin: A :class:`~accel.TorchTensorParallelPlugin` (the older form of
            ``ParallelismConfig(tp_size=...)``): its config is used and its ``torch_device_mesh``
            set to the mesh built; kept as ``state.torch_tp_plugin``.
        megatron_lm_plugin: Accepted for Accelerate's signature; anything but None is refused.
        _from_accelerator: Accepted for Accelerate's signature and unused: accel lets scripts
            create an ``AcceleratorState`` without an ``Accelerator`` (Accelerate refuses).

    Raises:
        UnsupportedFeatureError: ``megatron_lm_plugin`` was given.
        AcceleratorConfigError: The state already exists with a different precision or
            parallelism config, or the config cannot run here.
    """

    _shared_state: ClassVar[dict[str, Any]] = shared_dict("AcceleratorState")

    def __init__(
        self,
        mixed_precision: PrecisionType | str | None = None,
        cpu: bool = False,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        backend: str | None = None,
        timeout: datetime.timedelta | None = None,
        parallelism_config: ParallelismConfig | None = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        _from_accelerator: bool = False,
    ) -> None:
        if megatron_lm_plugin is not None:
            raise UnsupportedFeatureError(
                f"AcceleratorState(megatron_lm_plugin={megatron_lm_plugin!r}): Megatron-LM is not "
                "supported by accel; shard large models with FSDP2, DeepSpeed or a "
                "ParallelismConfig instead, and pass megatron_lm_plugin=None."
            )
        if torch_tp_plugin is not None or parallelism_config is not None:
            from accel.parallelism import requested_config

            parallelism_config = requested_config(parallelism_config, torch_tp_plugin)
        self.__dict__ = self._shared_state
        partial = PartialState(cpu, backend=backend, timeout=timeout)
        requested = None if mixed_precision is None else PrecisionType(mixed_precision)
        if self.initialized:
            if requested is not None and requested != self.mixed_precision:
                raise AcceleratorConfigError(
                    f"AcceleratorState already uses mixed_precision={self.mixed_precision.value!r}; "
                    f"mixed_precision={requested.value!r} cannot be honoured in the same process. "
                    "Create one Accelerator per process, or call accel_state.reset_state() first."
                )
            if parallelism_config is not None and parallelism_config is not self.parallelism_config:
                raise AcceleratorConfigError(
                    "AcceleratorState already has its parallelism_config (device mesh); another "
                    "cannot be honoured in the same process. Create one Accelerator per process, "
                    "or call AcceleratorState._reset_state() first."
                )
            refuse_plugins_for_existing_state(self._shared_state, deepspeed_plugin)
            return
        contract = partial.contract
        deepspeed_plugin, deepspeed_plugins = split_deepspeed_plugins(deepspeed_plugin, None)
        fsdp_plugin, deepspeed_plugin = _launcher_plugins(partial, fsdp_plugin, deepspeed_plugin)
        self._shared_state.update(
            deepspeed_plugins=deepspeed_plugins,
            partial=partial,
            mixed_precision=requested if requested is not None else contract.mixed_precision,
            dynamo_plugin=dynamo_plugin
            or TorchDynamoPlugin(
                backend=contract.dynamo_backend,
                mode=contract.dynamo_mode,  # type: ignore[arg-type]
                fullgraph=contract.dynamo_use_fullgraph,
                dynamic=contract.dynamo_use_dynamic,
                use_regional_compilation=contract.dynamo_use_regional_compilation,
            ),
            deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin,
            torch_tp_plugin=torch_tp_plugin,
        )
        if parallelism_config is None:
            from accel.parallelism import launcher_config

            parallelism_config = launcher_config(contract)
        if parallelism_config is not None:
            self._build_mesh(parallelism_config)
        if torch_tp_plugin is not None:
            torch_tp_plugin.torch_device_mesh = self.device_mesh

    def _build_mesh(self, config: ParallelismConfig) -> None:
        """Fit, check and build the config's mesh for this job's strategy (see accel.parallelism)."""
        from accel.parallelism import build_parallel_mesh

        try:
            mesh = build_parallel_mesh(
                config,
                partial=self.partial,
                distributed_type=self.distributed_type,
                fsdp_version=self._fsdp_version(),
            )
        except BaseException:
            self._shared_state.clear()
            raise
        self._shared_state.update(parallelism_config=config, parallel_mesh=mesh)

    def _fsdp_version(self) -> int:
        """The FSDP version a job of type FSDP would use (plugin, else launcher, else 2)."""
        if self.distributed_type is not DistributedType.FSDP:
            return 2
        from accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

        plugin = self._shared_state.get("fsdp_plugin")
        if not isinstance(plugin, FullyShardedDataParallelPlugin):
            plugin = FullyShardedDataParallelPlugin()
        return plugin.resolved(self.partial.contract.fsdp_config).fsdp_version

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        """The job's :class:`~accel_state.ParallelismConfig` (resolved), else ``None``."""
        return self._shared_state.get("parallelism_config")

    @property
    def parallel_mesh(self) -> ParallelMesh | None:
        """The meshes of :attr:`parallelism_config`, else ``None``."""
        return self._shared_state.get("parallel_mesh")

    @property
    def device_mesh(self) -> Any:
        """The job's ``DeviceMesh`` (Accelerate's ``state.device_mesh``), else ``None``."""
        mesh = self.parallel_mesh
        return None if mesh is None else mesh.world_mesh

    @property
    def initialized(self) -> bool:
        """Whether the shared record has been filled."""
        return "partial" in self._shared_state

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forget the shared training settings (the PartialState lives on, as in Accelerate).

        The :class:`PartialState` and its process group are reset too only with
        ``reset_partial_state=True``.
        """
        cls._shared_state.clear()
        activate(None)
        if reset_partial_state:
            PartialState._reset_state()

    def _require(self, key: str) -> Any:
        """A shared setting, or an error explaining that the state was reset."""
        try:
            return self._shared_state[key]
        except KeyError:
            raise state_reset_error(key) from None

    @property
    def mixed_precision(self) -> PrecisionType:
        """The mixed-precision mode."""
        return self._require("mixed_precision")  # type: ignore[no-any-return]

    @property
    def distributed_type(self) -> DistributedType:
        """The job's distributed mode (plugins passed here take precedence over the launcher)."""
        assigned = self._shared_state.get("distributed_type")
        if assigned is not None:
            return assigned  # type: ignore[no-any-return]
        if self._shared_state.get("deepspeed_plugin") is not None:
            return DistributedType.DEEPSPEED
        if self._shared_state.get("fsdp_plugin") is not None:
            return DistributedType.FSDP
        kind = self.partial.distributed_type
        mesh = self._shared_state.get("parallel_mesh")
        if mesh is not None and mesh.config.shards_parameters and kind in _DATA_PARALLEL_TYPES:
            return DistributedType.FSDP  # dp_shard_size > 1 shards with FSDP2
        return kind

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        """Assign the mode, as Accelerate's tests do to take another code path; ``None`` undoes it."""
        self._shared_state["distributed_type"] = None if value is None else DistributedType(value)

    @property
    def partial(self) -> PartialState:
        """The underlying :class:`PartialState` (after ``_reset_state()``, the one that lives on)."""
        partial = self._shared_state.get("partial")
        if partial is None:
            partial = _surviving_partial_state()
        if partial is None:
            raise state_reset_error("partial")
        return partial  # type: ignore[no-any-return]

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return self.partial.device

    def _facts(self) -> tuple[Any, ...]:
        """What two states must share to be equal: layout, device, mode and precision."""
        return (
            self.distributed_type,
            self.partial.num_processes,
            self.partial.process_index,
            self.partial.local_process_index,
            self.device,
            self.mixed_precision,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AcceleratorState):
            return NotImplemented
        if not (self.initialized and other.initialized):
            return self.initialized == other.initialized
        return self._facts() == other._facts()

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        return dict(self._shared_state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled where the state exists, rejoin it; elsewhere keep the pickled copy."""
        if "partial" in self._shared_state:
            self.__dict__ = self._shared_state
        else:
            self.__dict__ = dict(state)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        partial = self.__dict__.get("partial")
        if partial is None:
            partial = _surviving_partial_state()
        if partial is None:
            raise state_reset_error(name)
        try:
            return getattr(partial, name)
        except AttributeError as error:
            if isinstance(error, PartialStateResetError):
                raise
            raise AttributeError(
                f"'AcceleratorState' object has no attribute '{name}'", name=name, obj=self
            ) from None

    def __repr__(self) -> str:
        return f"{self.partial!r}Mixed precision type: {self.mixed_precision.value}\n"


def _launcher_plugins(
    partial: PartialState, fsdp_plugin: Any, deepspeed_plugin: Any
) -> tuple[Any, Any]:
    """The FSDP and DeepSpeed plugins, made from the launcher's settings where none was given.

    As in Accelerate, ``state.fsdp_plugin`` / ``state.deepspeed_plugin`` exist whenever the job
    uses FSDP / DeepSpeed, whether the settings came from a plugin or from ``accel launch``
    (``--use_fsdp``, ``distributed_type: FSDP``, Accelerate's ``ACCELERATE_USE_FSDP``...); code
    such as transformers' Trainer tells the job's kind by them. An FSDP plugin's unset fields
    are filled with the resolved settings (launcher's, else defaults), as Accelerate's plugin
    holds its final values.

    Raises:
        AcceleratorConfigError: The FSDP settings are invalid.
    """
    from accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

    contract = partial.contract
    launched = partial.distributed_type
    if isinstance(fsdp_plugin, FullyShardedDataParallelPlugin):
        fsdp_plugin.fill_unset(contract.fsdp_config)
    elif fsdp_plugin is None and deepspeed_plugin is None and launched is DistributedType.FSDP:
        fsdp_plugin = FullyShardedDataParallelPlugin.from_launcher(contract.fsdp_config)
    if deepspeed_plugin is None and fsdp_plugin is None and launched is DistributedType.DEEPSPEED:
        from accel.strategies.deepspeed.plugin import DeepSpeedPlugin

        deepspeed_plugin = DeepSpeedPlugin.from_launch_config(contract.deepspeed_config)
    return fsdp_plugin, deepspeed_plugin


def current_precision_and_device() -> tuple[PrecisionType, torch.device]:
    """The precision mode and device of this process's ``AcceleratorState``.

    For Accelerate's free helpers that take no Accelerator (``get_mixed_precision_context_manager``):
    the one place outside an Accelerator that reads the process's settings. As in Accelerate,
    a process without one gets a default ``AcceleratorState`` (the launcher's settings).
    """
    state = AcceleratorState()
    return state.mixed_precision, state.device


def current_distributed_type() -> DistributedType | None:
    """The distributed mode of this process's ``AcceleratorState``, else ``None`` (none made)."""
    return AcceleratorState().distributed_type if is_initialized() else None


def deepspeed_required(func: F) -> F:
    """Make ``func`` raise when an Accelerator exists that is not set up for DeepSpeed.

    Raises:
        AcceleratorConfigError: (when called) the current ``AcceleratorState`` is not DeepSpeed.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kind = current_distributed_type()
        if kind is not None and kind != DistributedType.DEEPSPEED:
            raise AcceleratorConfigError(
                f"{func.__name__} needs DeepSpeed, but the Accelerator runs {kind}: "
                "create it with deepspeed_plugin=... (or accel launch --use_deepspeed) "
                "before calling it."
            )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def is_initialized() -> bool:
    """Whether an :class:`AcceleratorState` exists in this process (an Accelerator was made)."""
    return "partial" in AcceleratorState._shared_state


__all__ = [
    "AcceleratorState",
    "GradientState",
    "PartialState",
    "SharedDict",
    "ThreadLocalSharedDict",
    "deepspeed_required",
    "do_nothing",
    "get_int_from_env",
    "is_initialized",
]
