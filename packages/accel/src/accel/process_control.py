"""The Accelerator's process control: collectives, barriers, per-process decorators, triggers.

Accelerate's module-level :func:`wait_for_everyone` (``accelerate.utils``) is the same barrier
without an Accelerator.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import accel_ops
from accel.fault_tolerance import FaultTolerance
from accel.job_facts import JobFactsMixin
from accel.triggers import Trigger
from accel_ops.records import record as record_collective
from accel_state import PartialState

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def wait_for_everyone() -> None:
    """Block until every process reaches this call (``PartialState().wait_for_everyone()``)."""
    PartialState().wait_for_everyone()


class ProcessControlMixin(JobFactsMixin):
    """Collectives and process coordination on an Accelerator (Accelerate's names).

    The host class provides the attributes declared here and in :class:`JobFactsMixin`.
    """

    fault_tolerance: FaultTolerance
    _trigger: Trigger

    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nested structure of tensors) from every process on dim 0."""
        return accel_ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for evaluation, dropping the samples duplicated to even out the last batch.

        Args:
            input_data: Tensors (nested) or any picklable objects.
            use_gather_object: Gather as Python objects even if every leaf is a tensor.
        """
        try:
            accel_ops.recursively_apply(lambda tensor: tensor, input_data, error_on_other_type=True)
            all_tensors = True
        except TypeError:
            all_tensors = False
        as_objects = use_gather_object or not all_tensors
        # Over the data-parallel ranks only: ranks of one tensor/context-parallel group hold
        # the same samples.
        partial = self.state.partial
        if partial.data_parallel_size == 1:
            data = input_data
        else:
            group = partial.data_parallel_group
            gather = accel_ops.gather_object if as_objects else accel_ops.gather
            data = gather(input_data, process_group=group)
        remainder = self.gradient_state.remainder
        if not self.gradient_state.end_of_dataloader or remainder <= 0:
            return data
        if as_objects:
            return data[:remainder]
        return accel_ops.recursively_apply(lambda tensor: tensor[:remainder], data)

    def reduce(
        self, tensor: Any, reduction: accel_ops.collectives.Reduction = "sum", scale: float = 1.0
    ) -> Any:
        """Reduce ``tensor`` across processes (``"sum"``, ``"mean"``, ``"max"`` or ``"none"``)."""
        return accel_ops.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` on ``dim`` to the largest size across processes."""
        return accel_ops.pad_across_processes(
            tensor, dim=dim, pad_index=pad_index, pad_first=pad_first
        )

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this call."""
        with record_collective("wait_for_everyone"):
            self.state.partial.wait_for_everyone()

    @property
    def restart_count(self) -> int:
        """Restarts so far: by ``accel launch --max_restarts`` (torch elastic) and SLURM requeues.

        The sum of ``TORCHELASTIC_RESTART_COUNT`` and ``SLURM_RESTART_COUNT``: 0 on a first run.
        """
        return self.fault_tolerance.restart_count

    @property
    def should_stop(self) -> bool:
        """Collective: True on every process, at the same step, once any process got SIGTERM.

        Read it once per step on every process; when True, ``save_state()`` and leave the loop:
        ``accel launch`` then exits with status 75, which asks the scheduler to requeue the job.
        The first read installs the SIGTERM handler (see :mod:`accel.fault_tolerance`).
        """
        return self.fault_tolerance.should_stop()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (on each local main process), also after ``end_training()``."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """The main process runs the block first, then the others."""
        return self.state.partial.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Each machine's local main process runs the block first."""
        return self.state.partial.local_main_process_first()

    def on_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on the main process only."""
        return self.state.partial.on_main_process(function)

    def on_local_main_process(self, function: F) -> F:
        """Decorator: run ``function`` on each machine's local main process only."""
        return self.state.partial.on_local_main_process(function)

    def on_last_process(self, function: F) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self.state.partial.on_last_process(function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on global rank ``process_index`` only."""
        return self.state.partial.on_process(function, process_index=process_index)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on local rank ``local_process_index`` only."""
        return self.state.partial.on_local_process(
            function, local_process_index=local_process_index
        )

    def split_between_processes(
        self, inputs: T, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[T]:
        """Give each process a contiguous share of ``inputs``."""
        return self.state.partial.split_between_processes(inputs, apply_padding=apply_padding)

    def set_trigger(self) -> None:
        """Raise this process's flag; the next :meth:`check_trigger` is then True everywhere."""
        self._trigger.set()

    def check_trigger(self) -> bool:
        """Collective: True on every process when any process called :meth:`set_trigger`."""
        return self._trigger.check()
