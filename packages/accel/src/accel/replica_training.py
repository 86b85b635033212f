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
* a relaunched group heals from a live one at its first step: models, optimizer, scheduler,
  dataloader positions, grad scaler, RNG states and counters;
* ``gather``, ``reduce``, ``wait_for_everyone`` stay inside the group; ``save_state`` writes
  in one group only (the first of the step's quorum).

torchft itself is only called through :mod:`accel_state.torchft_api`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

import torch

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel_ckpt.rng_state import capture_rng_states, restore_rng_states
from accel_data.shared_position import SharedPositionLoader
from accel_state import DistributedType, contract
from accel_state.errors import ReplicaQuorumError
from accel_state.torchft_api import ReplicaManager, create_replica_manager

#: Pause before a relaunched group that found no group to heal from asks for a quorum again.
RELAUNCHED_RETRY_SECONDS = 0.2

if TYPE_CHECKING:
    from accel.accelerator import Accelerator
    from accel.optimizer import AcceleratedOptimizer


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
        timeout: Seconds for the collectives across groups, commit votes and healing copies.
        quorum_timeout: Seconds a step waits for its quorum (too few groups: the job stops).
        connect_timeout: Seconds to reach the lighthouse and the other groups.
    """

    replica_id: int | None = None
    replicas: int | None = None
    min_replicas: int | None = None
    lighthouse: str | None = None
    timeout: float = 30.0
    quorum_timeout: float = 60.0
    connect_timeout: float = 30.0

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

    def __init__(self, plugin: FaultTolerancePlugin, accelerator: Accelerator) -> None:
        _refuse_unsupported(accelerator)
        self.plugin = plugin
        self._accelerator = accelerator
        self._loaders: list[SharedPositionLoader] = []
        self._step_open = False
        self._saving_rank: int | None = None
        self._quorum_seen = False
        #: Relaunched by ``accel launch`` after a failure: must heal before it trains.
        self._relaunched = int(os.environ.get(contract.FT_GROUP_RESTART_COUNT, "0")) > 0
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
        )
        atexit.register(self.manager.shutdown)

    # The quorum (accel_data.shared_position.StepQuorum) ----------------------------------------
    def open_step(self) -> tuple[int, int]:
        """This process's ``(slot, slots)`` in the open step, forming its quorum if needed."""
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
        """Form the step's quorum; a relaunched group first waits until it can heal.

        A relaunched group holds no trained state: in a quorum without a trained group (alone,
        or with other relaunched groups, while the others are busy in a step) it would train
        from scratch apart from the job. Until it has healed from a live group, it asks again.

        Raises:
            ReplicaQuorumError: No live group to heal from within the quorum timeout.
        """
        deadline = time.monotonic() + self.manager.quorum_timeout_s
        while True:
            self.manager.start_step()
            # Healed (the job's step copied in), or every group is here (a job that failed
            # before its first commit): anything else may be relaunched groups among themselves.
            if (
                not self._relaunched
                or self.manager.committed_steps > 0
                or self.manager.participants >= int(self.plugin.replicas or 1)
            ):
                self._relaunched = False
                return
            if time.monotonic() > deadline:
                raise ReplicaQuorumError(
                    f"replica group {self.plugin.replica_id} was relaunched but found no live "
                    f"group to heal from within {self.manager.quorum_timeout_s:g} s (no quorum "
                    "held a trained group); it does not train from scratch beside a job that "
                    "has moved on. Check that the other groups are alive."
                )
            time.sleep(RELAUNCHED_RETRY_SECONDS)

    def serves_shared_position(self) -> bool:
        """Training iterations (a prepared model in train mode) take the shared position."""
        models = self._accelerator._models
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
        """Average the gradients across groups and vote; whether the optimizer may step."""
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

    # Healing ---------------------------------------------------------------------------------
    def healing_state(self) -> dict[str, Any]:
        """What a healing group copies from this one (torchft calls it from its thread)."""
        accelerator = self._accelerator
        return {
            "models": [model.state_dict() for model in accelerator._models],
            "optimizers": [optimizer.state_dict() for optimizer in accelerator._optimizers],
            "schedulers": [scheduler.state_dict() for scheduler in accelerator._schedulers],
            "loaders": [loader.position.state_dict() for loader in self._loaders],
            "scaler": None if accelerator.scaler is None else accelerator.scaler.state_dict(),
            "step": accelerator.step,
            "checkpoint_iteration": accelerator.project_configuration.iteration,
            "rng": capture_rng_states(),
        }

    def load_healing_state(self, state: dict[str, Any]) -> None:
        """Take over a live group's state (before this group's first step after joining)."""
        accelerator = self._accelerator
        for model, model_state in zip(accelerator._models, state["models"], strict=True):
            model.load_state_dict(model_state)
        for optimizer, optimizer_state in zip(
            accelerator._optimizers, state["optimizers"], strict=True
        ):
            optimizer.load_state_dict(optimizer_state)
        for scheduler, scheduler_state in zip(
            accelerator._schedulers, state["schedulers"], strict=True
        ):
            scheduler.load_state_dict(scheduler_state)
        for loader, position in zip(self._loaders, state["loaders"], strict=True):
            loader.position.load_state_dict(position)
        if accelerator.scaler is not None and state["scaler"] is not None:
            accelerator.scaler.load_state_dict(state["scaler"])
        accelerator.step = int(state["step"])
        accelerator.project_configuration.iteration = int(state["checkpoint_iteration"])
        restore_rng_states(state["rng"], "the healing copy")


def _refuse_unsupported(accelerator: Accelerator) -> None:
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
