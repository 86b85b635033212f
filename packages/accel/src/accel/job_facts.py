"""The Accelerator's facts about the job: device, ranks, precision, batching, accumulation."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from accel.accelerator_state import AcceleratorState, is_initialized, state_reset_error
from accel.errors import AcceleratorConfigError
from accel.plugins import GradientAccumulationPlugin
from accel.precision import Precision
from accel.strategies.base import ModelStrategy
from accel_ckpt import ProjectConfiguration
from accel_data import DataLoaderConfiguration
from accel_state import DistributedType, GradientState, PartialState


@dataclasses.dataclass(frozen=True)
class ProcessFacts:
    """Where this process stood in the job, recorded by ``end_training()`` before the reset."""

    num_processes: int
    process_index: int
    local_process_index: int
    is_main_process: bool
    is_local_main_process: bool
    is_last_process: bool
    use_distributed: bool

    @classmethod
    def of(cls, partial: PartialState) -> ProcessFacts:
        """The facts of a live :class:`~accel_state.PartialState`."""
        return cls(
            **{field.name: getattr(partial, field.name) for field in dataclasses.fields(cls)}
        )


class JobFactsMixin:
    """Read-only facts (and the two accumulation settings) of an Accelerator, as Accelerate names them.

    The host class provides the attributes declared here.
    """

    state: AcceleratorState
    gradient_state: GradientState
    precision: Precision
    strategy: ModelStrategy
    dataloader_config: DataLoaderConfiguration
    project_configuration: ProjectConfiguration
    _optimizers: list[Any]
    #: Set by ``end_training()``: the rank facts stay readable (and ``print`` works) after it.
    _ended_facts: ProcessFacts | None = None

    def _surviving_facts(self) -> ProcessFacts | PartialState:
        """As :meth:`_facts`, but after a reset the process's ``PartialState`` answers.

        Accelerate's ``is_main_process`` and its kin ask ``PartialState()``, which outlives
        ``AcceleratorState._reset_state()``; its ranks and sizes do not.
        """
        if is_initialized() or self._ended_facts is not None:
            return self._facts("is_main_process")
        return PartialState()

    def _facts(self, name: str) -> ProcessFacts | PartialState:
        """The live process state, or after ``end_training()`` the facts recorded then.

        Raises:
            StateResetError: ``AcceleratorState._reset_state()`` ran after this Accelerator was
                made (and not through ``end_training()``): reading ``name`` is refused, as in
                Accelerate, instead of answering from whatever state exists now.
        """
        if is_initialized():
            return self.state.partial
        if self._ended_facts is not None:
            return self._ended_facts
        raise state_reset_error(name)

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        """The job's distributed mode."""
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        """Number of processes in the job."""
        return self._facts("num_processes").num_processes

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self._facts("process_index").process_index

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its machine."""
        return self._facts("local_process_index").local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0."""
        return self._surviving_facts().is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 of each machine."""
        return self._surviving_facts().is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """True on the highest global rank."""
        return self._surviving_facts().is_last_process

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self._surviving_facts().use_distributed

    @property
    def mixed_precision(self) -> str:
        """The mixed-precision mode (``"no"``, ``"fp16"``, ``"bf16"``...)."""
        return self.state.mixed_precision.value

    @property
    def native_amp(self) -> bool:
        """Whether torch autocast is in use."""
        return self.precision.autocast_dtype is not None

    @property
    def split_batches(self) -> bool:
        """Whether batches are split across processes."""
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        """Whether the last round of batches is completed by wrapping around."""
        return self.dataloader_config.even_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether rank 0 reads batches and dispatches slices."""
        return self.dataloader_config.dispatch_batches

    @property
    def project_dir(self) -> str | None:
        """The project folder, if any."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """Where trackers write: the project configuration's logging_dir (default project_dir)."""
        return self.project_configuration.logging_dir

    @property
    def sync_gradients(self) -> bool:
        """Whether the current micro-step synchronises gradients and steps the optimizer."""
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.set_sync_gradients(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-steps per optimizer step."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        """Set the micro-steps per optimizer step (a whole number of at least 1).

        Raises:
            AcceleratorConfigError: ``steps`` is not an int of at least 1 (``None`` included).
        """
        if steps is None:
            raise AcceleratorConfigError(
                "accelerator.gradient_accumulation_steps = None: give a whole number of "
                "micro-steps per optimizer step, at least 1 (1 turns accumulation off)."
            )
        GradientAccumulationPlugin(num_steps=steps)  # validates the value
        self.gradient_state.plugin_kwargs["num_steps"] = steps

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether any prepared optimizer skipped its last step (fp16 inf/nan gradients)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    @property
    def multi_device(self) -> bool:
        """Whether several accelerators take part (multi-process GPU, XPU, NPU... but not CPU)."""
        kind = self.distributed_type
        return (
            self.use_distributed and kind.value.startswith("MULTI_") and kind.value != "MULTI_CPU"
        )

    @property
    def non_blocking(self) -> bool:
        """``DataLoaderConfiguration.non_blocking``: asynchronous host-to-device batch copies."""
        return bool(self.dataloader_config.non_blocking)

    @property
    def use_seedable_sampler(self) -> bool:
        """``DataLoaderConfiguration.use_seedable_sampler``."""
        return bool(self.dataloader_config.use_seedable_sampler)

    @property
    def use_stateful_dataloader(self) -> bool:
        """``DataLoaderConfiguration.use_stateful_dataloader``."""
        return bool(self.dataloader_config.use_stateful_dataloader)

    @property
    def save_iteration(self) -> int:
        """Number of the next automatically named checkpoint (``checkpoint_<n>``)."""
        return self.project_configuration.iteration

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes the model: the local main process (weights are gathered first)."""
        return self.is_local_main_process

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (``fully_shard``)."""
        settings = getattr(self.strategy, "fsdp", None)
        return self.distributed_type is DistributedType.FSDP and (
            getattr(settings, "fsdp_version", None) == 2
        )
