"""The run configuration: what one Accelerator runs with, resolved once and handed down.

``Accelerator.__init__`` merges its arguments, plugins, config file and the launch contract (through
:class:`~accel.AcceleratorState`, Accelerate's view of the same settings) into one frozen
:class:`RunConfig`. The strategy, precision, data and checkpoint layers receive it (or the fields
they need) as arguments; none of them asks the process-wide state.

Example:
    >>> accelerator = Accelerator(mixed_precision="bf16")  # doctest: +SKIP
    >>> accelerator.run_config.mixed_precision  # doctest: +SKIP
    <PrecisionType.BF16: 'bf16'>
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from accel_state import DistributedType, GradientState, PartialState, PrecisionType
from accel_state.device_mesh import ParallelMesh

if TYPE_CHECKING:
    from accel.fp8.setup import FP8Setup
    from accel.kwargs_handlers import TorchDynamoPlugin
    from accel.strategies.deepspeed.named_plugins import DeepSpeedPluginRegistry


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The settings one Accelerator runs with, resolved once (user, config file, launcher).

    Attributes:
        process: The process's facts (rank, device, process group), Accelerate's ``PartialState``.
        distributed_type: The job's distributed mode, plugins given in code included.
        mixed_precision: The precision mode (``fp8`` included); the strategy builds its
            precision object from it (``strategy.make_precision``).
        gradient_accumulation_steps: The steps the Accelerator asked for (a DeepSpeed config may
            settle another value at ``prepare``; the live count is ``GradientState.num_steps``).
        split_batches: Whether each process's batch is a slice of the loader's batch.
        fsdp_plugin: The FSDP plugin (``None`` outside FSDP); its fields may be changed later by
            ``set_state_dict_type``, so readers resolve it when they act.
        deepspeed_plugins: The process's DeepSpeed plugin registry (``None`` outside DeepSpeed).
        dynamo_plugin: The ``torch.compile`` settings.
        parallel_mesh: The ``ParallelismConfig`` meshes, else ``None``.
        ddp_settings: ``DistributedDataParallelKwargs`` fields that differ from their defaults.
        fp8: The fp8 backend and recipe (handlers, launcher, what is installed); disabled unless
            ``mixed_precision`` is ``fp8``. ``None``: not resolved (fp8 off).
        gradient_state: The live accumulation state this Accelerator shares with its optimizers
            and schedulers (whether this micro-step synchronises); handed down, never looked up.
    """

    process: PartialState
    distributed_type: DistributedType
    mixed_precision: PrecisionType
    gradient_accumulation_steps: int
    split_batches: bool
    gradient_state: GradientState
    fsdp_plugin: Any = None
    deepspeed_plugins: DeepSpeedPluginRegistry | None = None
    dynamo_plugin: TorchDynamoPlugin | None = None
    parallel_mesh: ParallelMesh | None = None
    ddp_settings: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    fp8: FP8Setup | None = None

    def __post_init__(self) -> None:
        # Read-only, whatever mapping was given.
        object.__setattr__(self, "ddp_settings", MappingProxyType(dict(self.ddp_settings)))

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        """Pickle by fields (a read-only mapping does not pickle; its dict does)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["ddp_settings"] = dict(self.ddp_settings)
        return _rebuild, (fields,)

    @property
    def device(self) -> Any:
        """This process's device."""
        return self.process.device


def _rebuild(fields: dict[str, Any]) -> RunConfig:
    """A :class:`RunConfig` from its pickled fields."""
    return RunConfig(**fields)


__all__ = ["RunConfig"]
