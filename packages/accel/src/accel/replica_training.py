"""Training that survives a replica group's failure: per-step fault tolerance on torchft.

``accel launch --ft_replicas N`` runs N replica groups, each its own torch world (DDP inside
it), and a lighthouse that forms a quorum of the live groups at every optimizer step. Inside
the script nothing changes: ``Accelerator()`` reads the launcher's variables (or takes
``fault_tolerance=FaultTolerancePlugin(...)``) and then

* each prepared optimizer ``step()`` averages the gradients across the groups of the quorum
  and steps only if the step is *committed* by all of them; otherwise
  ``accelerator.optimizer_step_was_skipped`` is True, and the prepared scheduler and the
  accumulation counters do not move;
* the prepared training dataloader hands out samples by the committed position shared by the
  groups (:mod:`accel_data.shared_position`): no sample is lost or used twice;
* before its first step a group joins the job: it waits (up to the quorum timeout) until every
  group is in its quorum, or it has healed from a live one (models, optimizer, scheduler,
  dataloader positions, grad scaler, RNG states and counters); a relaunched group never trains
  from scratch beside the job, and a group that finds the job finished
  (``ACCEL_FT_JOB_FINISHED_FILE`` exists) has nothing to train and exits with code 0
  (:class:`ReplicaJobFinished`);
* inside ``LocalSGD(..., diloco=DiLoCoSettings())`` the groups train apart and sync every
  round instead (DiLoCo, :mod:`accel.outer_rounds`): the optimizer steps without the
  per-step average and vote, and a step of the shared position is one round;
* ``gather``, ``reduce``, ``wait_for_everyone`` stay inside the group; ``save_state`` writes
  in one group only (the first of the step's quorum), and the others write the checkpoint
  themselves if that group does not confirm that it finished.

torchft itself is only called through :mod:`accel_state.torchft_api`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel_ckpt.rng_state import capture_rng_states, restore_rng_states
from accel_ckpt.training_objects import Kind
from accel_data.shared_position import SharedPositionLoader
from accel_state import DistributedType, contract
from accel_state.errors import ReplicaQuorumError
from accel_state.torchft_api import ReplicaManager, create_replica_manager

#: Pause before a group that has not joined the job yet (see ``_start_step``) asks again.
JOIN_RETRY_SECONDS = 0.2
#: What a healing group copies of the training objects; the loaders' positions, the scaler,
#: counters and RNG travel beside them (see ``healing_state``).
_HEALED_KINDS: tuple[Kind, ...] = ("model", "optimizer", "scheduler")
#: What ``save_state`` returns (a folder, or a background save's handle).
Saved = TypeVar("Saved")


class ReplicaJobFinished(SystemExit):
    """Ends a relaunched replica group with exit code 0: another group finished the job.

    Raised from the group's first step (inside the training loop, so nothing after the loop,
    such as a save of the untrained model, runs); Python exits with code 0 without a traceback.
    """

    def __init__(self, replica_id: int, finished_by: str) -> None:
        super().__init__(0)
        self.replica_id = replica_id
        self.finished_by = finished_by


if TYPE_CHECKING:
    from accel.optimizer import AcceleratedOptimizer
    from accel.outer_rounds import OuterRounds
    from accel_ckpt import ProjectConfiguration, TrainingObjects
    from accel_data import DataLoaderConfiguration


class TrainingHost(Protocol):
    """What replica-group training uses of its Accelerator (handed in; never imported)."""

    step: int
    scaler: Any

    @property
    def state(self) -> Any:
        """The ``AcceleratorState`` (its ``partial`` and ``parallelism_config``)."""

    @property
    def training_objects(self) -> TrainingObjects:
        """The objects a training state covers (healed from a live group)."""

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Checkpoint naming (its ``iteration`` travels with a heal)."""

    @property
    def dataloader_config(self) -> DataLoaderConfiguration:
        """The loaders' settings (``data_seed``)."""

    @property
    def device(self) -> torch.device:
        """This process's device."""

    @property
    def device_placement(self) -> bool:
        """Whether batches are moved to :attr:`device`."""

    @property
    def distributed_type(self) -> DistributedType:
        """The job's distributed mode."""

    @property
    def is_main_process(self) -> bool:
        """Whether this is the job's first process."""

    @property
    def num_processes(self) -> int:
        """Processes in this replica group."""

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""

    def reduce(self, tensor: Any, reduction: Any = "sum", scale: float = 1.0) -> Any:
        """Reduce ``tensor`` across the group's processes."""


@dataclasses.dataclass
class FaultTolerancePlugin:
    """Settings of per-step fault tolerance across replica groups.

    Unset fields come from the variables ``accel launch --ft_replicas`` writes
    (``ACCEL_FT_REPLICA_ID``, ``ACCEL_FT_REPLICAS``, ``ACCEL_FT_MIN_REPLICAS``,
    ``TORCHFT_LIGHTHOUSE``). torchft's ``TORCHFT_TIMEOUT_SEC``, ``TORCHFT_QUORUM_TIMEOUT_SEC``
    and ``TORCHFT_CONNECT_TIMEOUT_SEC`` win over the timeouts here.

    Attributes:
        replica_id: This process's replica group, ``0..replicas-1``.
        replicas: Replica groups of the job.
        min_replicas: Fewest groups a step commits with (default 1).
        lighthouse: The lighthouse's address, ``http://host:port``.
        job_finished_file: A file that exists once a group has finished the job (the launcher
            creates it); a relaunched group that finds it exits with code 0.
        timeout: Seconds for the collectives across groups, commit votes and healing copies.
        quorum_timeout: Seconds a step waits for its quorum (too few groups: the job stops).
        connect_timeout: Seconds to reach the lighthouse and the other groups.
        address: This machine's address as the other groups reach it (``ACCEL_FT_ADDRESS``,
            which ``accel launch --ft_lighthouse`` writes); ``None``: torchft's own choice (the
            hostname), for groups on one machine.
    """

    replica_id: int | None = None
    replicas: int | None = None
    min_replicas: int | None = None
    lighthouse: str | None = None
    job_finished_file: str | None = None
    timeout: float = 30.0
    quorum_timeout: float = 60.0
    connect_timeout: float = 30.0
    address: str | None = None

    @classmethod
    def from_env(cls) -> FaultTolerancePlugin | None:
        """The launcher's settings, or ``None`` when this is no replica-group job."""
        if contract.FT_REPLICAS not in os.environ:
            return None
        return cls().resolved()

    def resolved(self) -> FaultTolerancePlugin:
        """A copy with unset fields filled from the environment, checked.

        Raises:
            AcceleratorConfigError: A field is missing or out of range, naming the fix.
        """
        values = dataclasses.replace(self)
        for field, variable in (
            ("replica_id", contract.FT_REPLICA_ID),
            ("replicas", contract.FT_REPLICAS),
            ("min_replicas", contract.FT_MIN_REPLICAS),
        ):
            if getattr(values, field) is None and variable in os.environ:
                setattr(values, field, _int_variable(variable))
        if values.lighthouse is None:
            values.lighthouse = os.environ.get(contract.FT_LIGHTHOUSE)
        if values.address is None:
            values.address = os.environ.get(contract.FT_ADDRESS) or None
        if values.job_finished_file is None:
            values.job_finished_file = os.environ.get(contract.FT_JOB_FINISHED_FILE)
        if values.min_replicas is None:
            values.min_replicas = 1
        if values.replica_id is None or values.replicas is None or values.lighthouse is None:
            raise AcceleratorConfigError(
                f"FaultTolerancePlugin(replica_id={values.replica_id}, replicas={values.replicas}, "
                f"lighthouse={values.lighthouse!r}) is incomplete: start the script with "
                "`accel launch --ft_replicas N ...`, or set all three."
            )
        if not 0 <= values.replica_id < values.replicas:
            raise AcceleratorConfigError(
                f"FaultTolerancePlugin replica_id={values.replica_id} is outside 0..{values.replicas - 1} "
                f"(replicas={values.replicas}); number replica groups from 0."
            )
        if not 1 <= values.min_replicas <= values.replicas:
            raise AcceleratorConfigError(
                f"FaultTolerancePlugin min_replicas={values.min_replicas} must be between 1 and "
                f"replicas={values.replicas}."
            )
        for name in ("timeout", "quorum_timeout", "connect_timeout"):
            if getattr(values, name) <= 0:
                raise AcceleratorConfigError(
                    f"FaultTolerancePlugin {name}={getattr(values, name)} must be a positive "
                    "number of seconds."
                )
        return values


def _int_variable(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise AcceleratorConfigError(
            f"{name}={value!r} is not a whole number; it is written by `accel launch "
            "--ft_replicas`: start the script with it, or unset the variable."
        ) from None


class ReplicaGroupTraining:
    """The replica-group side of one Accelerator: quorum per step, commit, healing, saving.

    Args:
        plugin: Resolved settings.
        accelerator: The Accelerator whose prepared objects are healed and stepped.

    Raises:
        UnsupportedFeatureError: DeepSpeed, or replicas inside the group (``dp_replicate``).
    """

    def __init__(self, plugin: FaultTolerancePlugin, accelerator: TrainingHost) -> None:
        _refuse_unsupported(accelerator)
        self.plugin = plugin
        self._accelerator = accelerator
        self._loaders: list[SharedPositionLoader] = []
        self._step_open = False
        self._saving_rank: int | None = None
        self._quorum_seen = False
        self._confirmed_at_step: int | None = None
        #: Relaunched by ``accel launch`` after a failure: must heal before it trains.
        self._relaunched = int(os.environ.get(contract.FT_GROUP_RESTART_COUNT, "0")) > 0
        #: Took part in a quorum with the job (healed, or with every group): trains normally.
        self._joined = False
        #: DiLoCo rounds in progress (``LocalSGD(diloco=...)``), else per-step commits.
        self.rounds: OuterRounds | None = None
        #: ``(participant rank, participants)`` the round's samples are split by.
        self.round_split: tuple[int | None, int] | None = None
        partial = accelerator.state.partial
        self.manager: ReplicaManager = create_replica_manager(
            device_type=accelerator.device.type,
            group_rank=partial.process_index,
            group_size=partial.num_processes,
            replica_id=int(plugin.replica_id or 0),
            min_replicas=int(plugin.min_replicas or 1),
            lighthouse=plugin.lighthouse,
            timeout_s=plugin.timeout,
            quorum_timeout_s=plugin.quorum_timeout,
            connect_timeout_s=plugin.connect_timeout,
            state_dict=self.healing_state,
            load_state_dict=self.load_healing_state,
            address=plugin.address,
        )
        atexit.register(self.manager.shutdown)

    # The quorum (accel_data.shared_position.StepQuorum) ----------------------------------------
    def open_step(self) -> tuple[int, int]:
        """This process's ``(slot, slots)`` in the open step, forming its quorum if needed.

        In DiLoCo rounds no quorum is formed here once the group joined: the round's samples are
        split by the quorum of the last sync.
        """
        if self.rounds is not None:
            if not self._joined:
                self._start_step()
            rank, participants = self.round_split or self.quorum_place()
            size = self.manager.group_size
            return (rank or 0) * size + self.manager.group_rank, max(participants, 1) * size
        if not self._step_open:
            self._start_step()
            self._step_open = True
            self._saving_rank = self.manager.participant_rank
            self._quorum_seen = True
        rank = self.manager.participant_rank
        size = self.manager.group_size
        participants = max(self.manager.participants, 1)
        if rank is None:  # not taking part: its share is dropped, any slot will do
            rank = 0
        return rank * size + self.manager.group_rank, participants * size

    def _start_step(self) -> None:
        """Form the step's quorum; before its first step, the group joins the job first.

        A group that has not trained yet holds no trained state. A relaunched one, in a quorum
        without a trained group (alone, or with other relaunched groups while the others are
        busy in a step), would train from scratch apart from the job; a fresh one that starts
        late would do the same after the others finished, or train its share alone while the
        others are still starting. So until it has healed from a trained group, or every group
        of the job is in its quorum, it asks again; if the launcher says the job has finished
        meanwhile, it exits with code 0 (:class:`ReplicaJobFinished`).

        Raises:
            ReplicaQuorumError: A relaunched group found no live group to heal from within the
                quorum timeout (a fresh group goes on with the groups it has then).
        """
        if self._joined:
            self.manager.start_step()
            return
        deadline = time.monotonic() + self.manager.quorum_timeout_s
        while True:
            finished_by, late = self._agreed_in_group(
                self._job_finished_by(), time.monotonic() > deadline
            )
            if finished_by is not None:
                self._exit_job_finished(finished_by)
            if late and self._relaunched:
                raise ReplicaQuorumError(
                    f"replica group {self.plugin.replica_id} was relaunched but found no live "
                    f"group to heal from within {self.manager.quorum_timeout_s:g} s (no quorum "
                    "held a trained group); it does not train from scratch beside a job that "
                    "has moved on. Check that the other groups are alive; if they finished the "
                    "job under launchers of their own (on other machines), this group had "
                    "nothing left to train."
                )
            try:
                self.manager.start_step()
            except ReplicaQuorumError:
                finished_by = self._job_finished_by()
                if finished_by is not None:
                    self._exit_job_finished(finished_by)
                raise
            replicas = int(self.plugin.replicas or 1)
            # Healed (the job's step copied in), or every group is here (a fresh job, or one
            # that failed before its first commit); a fresh group that waited the quorum
            # timeout goes on with the groups that came.
            joins = (
                self.manager.committed_steps > 0
                or self.manager.participants >= replicas
                or (late and not self._relaunched)
            )
            if self.rounds is not None:
                # The groups of this quorum are in a sync (or joining too): take part in it.
                fresh = self.manager.committed_steps == 0 and not self._relaunched
                self.rounds.join(commit=joins and fresh)
            if joins:
                if late and self.manager.participants < replicas:
                    self._say(
                        f"replica group {self.plugin.replica_id} starts with "
                        f"{self.manager.participants} of {replicas} replica groups: the others "
                        f"did not join within {self.manager.quorum_timeout_s:g} s (they heal "
                        "from this one when they come)"
                    )
                self._joined = True
                return
            time.sleep(JOIN_RETRY_SECONDS)

    def _agreed_in_group(self, finished_by: str | None, late: bool) -> tuple[str | None, bool]:
        """What every process of this group decides on: the job finished, the wait is over.

        The launcher's file can appear between two processes looking, and their clocks pass
        the deadline at different moments: decided apart, one would wait in a quorum for
        another that left.
        """
        finished, agreed_late = self._any_in_group(finished_by is not None, late)
        if finished and finished_by is None:
            finished_by = self._job_finished_by() or "a replica group"
        return (finished_by if finished else None), agreed_late

    def _any_in_group(self, *flags: bool) -> list[bool]:
        """Each flag, true if it is true on any process of this group (one collective)."""
        if self._accelerator.num_processes == 1:
            return list(flags)
        values = torch.tensor([int(flag) for flag in flags], device=self._accelerator.device)
        return [bool(value) for value in self._accelerator.reduce(values, "max").tolist()]

    def _job_finished_by(self) -> str | None:
        """Which group finished the job, as the launcher's file says; ``None`` while none has."""
        if self.plugin.job_finished_file is None:
            return None
        try:
            return Path(self.plugin.job_finished_file).read_text().strip() or "a replica group"
        except FileNotFoundError:
            return None

    def _exit_job_finished(self, finished_by: str) -> None:
        """End this group, which has not trained, with code 0: another group finished the job.

        Raises:
            ReplicaJobFinished: Always.
        """
        replica_id = int(self.plugin.replica_id or 0)
        started = "was relaunched" if self._relaunched else "started"
        self._say(
            f"replica group {replica_id} {started} after {finished_by} had finished the job: "
            "every sample was trained in a committed step, so there is nothing left to train "
            "and no live group to heal from; this group exits with code 0."
        )
        raise ReplicaJobFinished(replica_id, finished_by)

    def _say(self, line: str) -> None:
        """Print ``line`` on the group's main process (standard error)."""
        if self._accelerator.is_main_process:
            print(f"accel: {line}", file=sys.stderr, flush=True)

    def close_round(self) -> None:
        """The epoch's samples are all handed out: a DiLoCo round syncs now (else nothing)."""
        if self.rounds is not None:
            self.rounds.close_round()

    # DiLoCo rounds (accel.outer_rounds) --------------------------------------------------------
    def start_rounds(self, rounds: OuterRounds) -> None:
        """Train in DiLoCo rounds from now on (``LocalSGD(diloco=...)`` enters)."""
        self.rounds = rounds
        self.round_split = self.quorum_place() if self._joined else None

    def stop_rounds(self) -> None:
        """Back to per-step commits (``LocalSGD(diloco=...)`` exits)."""
        self.rounds = None
        self.round_split = None

    def quorum_place(self) -> tuple[int | None, int]:
        """``(participant rank, participants)`` in the quorum formed last."""
        return self.manager.participant_rank, self.manager.participants

    def round_pending(self) -> bool:
        """Whether samples were handed out since the last sync."""
        return any(loader.position.pending > 0 for loader in self._loaders)

    def round_ended(self, committed: bool) -> None:
        """A sync ended: commit the round's samples (or hand them out again); split anew."""
        self._saving_rank = self.manager.participant_rank
        self._quorum_seen = True
        self.round_split = self.quorum_place()
        for loader in self._loaders:
            loader.step_ended(committed)

    def serves_shared_position(self) -> bool:
        """Training iterations (a prepared model in train mode) take the shared position."""
        models = self._accelerator.training_objects.models
        return not models or any(model.training for model in models)

    # Loaders and optimizers ------------------------------------------------------------------
    def wrap_dataloader(self, dataloader: Any, in_group: Any) -> SharedPositionLoader:
        """A loader handing out samples by the committed position of the job."""
        partial = self._accelerator.state.partial
        seed = self._accelerator.dataloader_config.data_seed
        loader = SharedPositionLoader(
            dataloader,
            self,
            in_group=in_group,
            device=self._accelerator.device if self._accelerator.device_placement else None,
            seed=torch.initial_seed() if seed is None else seed,
            job_processes=partial.num_processes * int(self.plugin.replicas or 1),
        )
        self._loaders.append(loader)
        return loader

    def check_optimizer(self, optimizers: list[AcceleratedOptimizer]) -> None:
        """One optimizer per job: one commit per step.

        Raises:
            UnsupportedFeatureError: A second optimizer.
        """
        if len(optimizers) > 1:
            raise UnsupportedFeatureError(
                f"a second optimizer was prepared ({len(optimizers)} in all) under fault "
                "tolerance; each optimizer step is one commit across replica groups, so only "
                "one optimizer is supported. Put all parameters into one optimizer (parameter "
                "groups can hold different settings)."
            )

    def finish_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Average the gradients across groups and vote; whether the optimizer may step.

        In DiLoCo rounds the optimizer steps on the group's own gradients: True at once.
        """
        if self.rounds is not None:
            return True
        self.open_step()
        gradients = [
            _local(parameter.grad)
            for group in optimizer.param_groups
            for parameter in group["params"]
            if parameter.grad is not None
        ]
        flat = _flatten_by_kind(gradients)
        self.manager.average([buffer for buffer, _ in flat])
        for buffer, members in flat:
            for tensor, value in zip(
                members, torch._utils._unflatten_dense_tensors(buffer, members), strict=True
            ):
                tensor.copy_(value)
        committed = self.manager.should_commit()
        self._step_open = False
        for loader in self._loaders:
            loader.step_ended(committed)
        return committed

    # Saving ----------------------------------------------------------------------------------
    def saves_checkpoints(self) -> bool:
        """Whether this group writes ``save_state`` (the first of the last quorum)."""
        if not self._quorum_seen:
            return self.plugin.replica_id == 0
        return self._saving_rank == 0

    def save_in_one_group(
        self, write: Callable[[], Saved], saved_elsewhere: Callable[[], Path]
    ) -> Saved | Path:
        """``save_state`` across replica groups: one group writes, the others check it did.

        The saving group writes, then every group of the last quorum takes part in one
        collective: the others learn whether the saver finished. If it did not (it died while
        writing, or the collective failed), they write the same checkpoint themselves, into the
        same folder (published atomically, so a second writer replaces a complete copy with a
        complete copy), so no checkpoint is lost with the group that was writing it.

        Args:
            write: Writes the checkpoint from this process; returns what ``save_state`` returns.
            saved_elsewhere: The folder another group writes into (advances the automatic
                checkpoint number as a write would).
        """
        if self.saves_checkpoints():
            result = write()
            self._confirm_saved(wrote=True)
            return result
        iteration = self._accelerator.project_configuration.iteration
        folder = saved_elsewhere()
        if self._confirm_saved(wrote=False):
            return folder
        self._accelerator.project_configuration.iteration = iteration
        self._say(
            f"replica group {self.plugin.replica_id} writes checkpoint {folder} itself: the "
            "group writing it did not confirm that it finished (it failed, or a group of the "
            "last step's quorum did)."
        )
        return write()

    def _confirm_saved(self, wrote: bool) -> bool:
        """Whether the saving group confirmed its write (every process of the group agrees).

        Once per committed step: a relaunched group replays the ``save_state`` calls of the
        epochs the job had done (its loader yields nothing there) while the others train on,
        so a second save at the same committed step takes no collective.
        """
        step = self.manager.committed_steps
        if not self._quorum_seen or step == self._confirmed_at_step:
            return True  # before the first step (group 0 saves alone), or a replayed save
        self._confirmed_at_step = step
        average = self.manager.average_value(1.0 if wrote else 0.0, self._accelerator.device)
        confirmed = wrote or (average is not None and average > 0)
        (missing,) = self._any_in_group(not confirmed)
        return not missing

    # Healing ---------------------------------------------------------------------------------
    def healing_state(self) -> dict[str, Any]:
        """What a healing group copies from this one (torchft calls it from its thread)."""
        accelerator = self._accelerator
        return {
            "objects": accelerator.training_objects.state_dict(_HEALED_KINDS),
            "loaders": [loader.position.state_dict() for loader in self._loaders],
            "scaler": None if accelerator.scaler is None else accelerator.scaler.state_dict(),
            "step": accelerator.step,
            "checkpoint_iteration": accelerator.project_configuration.iteration,
            "rng": capture_rng_states(),
        }

    def load_healing_state(self, state: dict[str, Any]) -> None:
        """Take over a live group's state (before this group's first step after joining)."""
        accelerator = self._accelerator
        accelerator.training_objects.load_state_dict(state["objects"], _HEALED_KINDS)
        for loader, position in zip(self._loaders, state["loaders"], strict=True):
            loader.position.load_state_dict(position)
        if accelerator.scaler is not None and state["scaler"] is not None:
            accelerator.scaler.load_state_dict(state["scaler"])
        accelerator.step = int(state["step"])
        accelerator.project_configuration.iteration = int(state["checkpoint_iteration"])
        restore_rng_states(state["rng"], "the healing copy")


def _refuse_unsupported(accelerator: TrainingHost) -> None:
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise UnsupportedFeatureError(
            "DeepSpeed with fault tolerance across replica groups: DeepSpeed's engine owns "
            "the gradients and the optimizer step, so a step cannot be left uncommitted. Use "
            "DDP or FSDP inside each replica group (drop --use_deepspeed), or run without "
            "--ft_replicas."
        )
    config = accelerator.state.parallelism_config
    if config is not None and getattr(config, "dp_replicate_size", 1) > 1:
        raise UnsupportedFeatureError(
            f"parallelism_config dp_replicate_size={config.dp_replicate_size} with fault "
            "tolerance: the replica groups are the replicated dimension. Set "
            "dp_replicate_size=1 and start one group per replica with --ft_replicas."
        )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the same shard in every group), or the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _flatten_by_kind(
    tensors: list[torch.Tensor],
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """One flat buffer per (device, dtype), with the tensors it holds (one collective each)."""
    kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        kinds.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return [(torch._utils._flatten_dense_tensors(members), members) for members in kinds.values()]
