"""Agreement between processes while checkpointing, on a process group of its own.

Collectives run on a separate gloo group (created once per process group), so a background save
can synchronise while the training loop runs collectives on the default group, and CPU objects
never travel through NCCL. Every step exchanges a status, so a failure on one process makes every
process raise instead of leaving the others waiting in a barrier.
"""

from __future__ import annotations

import contextlib
import datetime
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch.distributed as dist

from accel_ckpt.errors import DistributedCheckpointError
from accel_ops import gather_objects_by_rank
from accel_ops.records import annotate

T = TypeVar("T")
# Weak references to (default group, checkpoint group): torch's registry owns both until
# destroy_process_group(); a strong reference here would keep their gloo threads alive after it,
# and a thread that needs the GIL during interpreter shutdown aborts the process.
_GROUP: list[weakref.ref[Any]] = []


def _checkpoint_group(timeout: datetime.timedelta | None = None) -> Any:
    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedCheckpointError(
            "Several processes are running but torch.distributed is not initialised; create "
            "accel_state.PartialState() (or the Accelerator) in every process before saving."
        )
    world = dist.group.WORLD
    if _GROUP and _GROUP[0]() is world:
        group = _GROUP[1]()
        if group is not None:
            return group
    # Creating the group is itself collective: a process that saves alone waits here, for the
    # job's collective timeout (not torch's 30-minute default), and then says so.
    group = dist.new_group(backend="gloo", timeout=timeout)
    _GROUP[:] = [weakref.ref(world), weakref.ref(group)]
    return group


@dataclass(frozen=True)
class Outcome:
    """One process's result of a step: a value, or the error it hit."""

    ok: bool
    value: Any = None
    error: str = ""


class Coordinator:
    """Who this process is, and collectives for the checkpoint protocol.

    Args:
        rank: Global rank.
        world_size: Number of processes.
        local_rank: Rank on this machine.
        node_rank: Index of this machine.

    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        node_rank: int,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.node_rank = node_rank
        self._group = _checkpoint_group(timeout) if world_size > 1 else None
        #: A step failed and every process knows (see :meth:`settle_after_failure`).
        self.failure_agreed = False

    @property
    def group(self) -> Any:
        """The checkpoint's own gloo group (``None`` with a single process)."""
        return self._group

    @classmethod
    def current(cls) -> Coordinator:
        """From ``accel_state.PartialState`` (initialising it if needed)."""
        from accel_state.partial_state import PartialState

        state = PartialState()
        return cls(
            state.process_index,
            state.num_processes,
            state.local_process_index,
            state.node_rank,
            timeout=state.timeout if state.use_distributed else None,
        )

    def all_gather(self, value: Any) -> list[Any]:
        """Every process's ``value``, by rank."""
        if self._group is None:
            return [value]
        # accel-ops moves the pickled bytes as uint8 tensors: torch's all_gather_object would
        # need numpy, which neither torch nor a plain install of ours depends on.
        return gather_objects_by_rank(value, self._group)

    def agree(self, outcome: Outcome, step: str) -> list[Any]:
        """Exchange outcomes; return every value, or raise on every process if any failed."""
        outcomes: list[Outcome] = self.all_gather(outcome)
        failed = [(rank, o.error) for rank, o in enumerate(outcomes) if not o.ok]
        if failed:
            details = "; ".join(f"rank {rank}: {error}" for rank, error in failed)
            raise DistributedCheckpointError(f"{step} failed, nothing was committed. {details}")
        return [o.value for o in outcomes]

    def step(self, name: str, function: Callable[[], T]) -> list[T]:
        """Run ``function`` here, then agree: its result from every rank, or raise everywhere.

        The process whose ``function`` failed re-raises its own exception; the others raise
        :class:`DistributedCheckpointError` naming it.
        """
        annotate(name)
        self.failure_agreed = False
        local_error: Exception | None = None
        try:
            outcome = Outcome(True, function())
        except Exception as error:  # noqa: BLE001 - reported to every process, then re-raised
            local_error = error
            outcome = Outcome(False, error=f"{type(error).__name__}: {error}")
        try:
            return self.agree(outcome, name)
        except DistributedCheckpointError:
            self.failure_agreed = True
            if local_error is not None:
                raise local_error from None
            raise

    def settle_after_failure(self) -> None:
        """After a failure every process learned of: wait until all have cleaned up.

        Without it a process could return from the failed save while another still removes the
        temporary folder. Only called when the failure was agreed (the group still works); a
        broken group here is ignored, since the failure is already being raised.
        """
        if self._group is None or not self.failure_agreed:
            return
        self.failure_agreed = False
        with contextlib.suppress(Exception):
            self.all_gather(None)
