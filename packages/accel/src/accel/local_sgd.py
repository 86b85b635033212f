"""``LocalSGD``: train without per-step gradient synchronisation, average parameters every N steps.

With ``diloco=DiLoCoSettings()`` in a replica-group job (``accel launch --ft_replicas N``) the
groups run DiLoCo instead: torchft's outer optimizer over averaged pseudo-gradients.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from accel.diloco import DiLoCoSettings, split_into_fragments
from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.outer_rounds import OuterRounds
from accel_state import DistributedType

if TYPE_CHECKING:
    from accel.accelerator import Accelerator

_SUPPORTED = (
    DistributedType.NO,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_HPU,
)
#: DiLoCo keeps the group's own per-step sync, so sharded groups work too.
_SUPPORTED_DILOCO = (*_SUPPORTED, DistributedType.FSDP)


class LocalSGD:
    """Local SGD: step on local gradients, average parameters every ``local_sgd_steps`` steps.

    Processes skip the gradient all-reduce inside the block and average their parameters every
    ``local_sgd_steps`` optimizer steps and when the block ends. In a replica-group job
    (``accel launch --ft_replicas N``) without ``diloco`` this is unchanged: the parameters are
    averaged over the processes of each group, while every optimizer step still averages the
    gradients across the groups and commits (per-step fault tolerance).

    With ``diloco`` (replica-group jobs only) the groups run DiLoCo on torchft instead: inside
    the block each group steps its optimizer on its own gradients (the group's DDP/FSDP2 sync
    stays; the per-step average across groups and the per-step commit are off), and every
    ``local_sgd_steps`` calls of :meth:`step` (``local_sgd_steps // fragments`` for streaming
    DiLoCo) the groups sync: the pseudo-gradients are averaged across the groups and the outer
    optimizer steps, or, if the sync fails, the parameters go back to the last sync. The
    prepared training dataloader counts one sync's inner batches as one step of the shared
    position: every sample is trained in exactly one committed round (a failed round's samples
    are handed out again; the epoch's last round syncs when its samples run out). With
    ``fragments > 1`` a failed sync restores only its fragment, so the other fragments keep
    what they learnt from the round's samples. When the block ends, the round in progress is
    synced, then every other fragment once, so all groups leave it with the same parameters.

    Example:
        >>> with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:
        ...     for batch in dataloader:
        ...         ...
        ...         optimizer.step()
        ...         local_sgd.step()
        >>> diloco = DiLoCoSettings(outer_lr=0.7)  # in `accel launch --ft_replicas 2 train.py`
        >>> with LocalSGD(accelerator, model, 8, diloco=diloco) as local_sgd:
        ...     ...

    Args:
        accelerator: The Accelerator that prepared ``model``.
        model: The prepared model.
        local_sgd_steps: Optimizer steps between parameter averages (>= 1).
        enabled: False turns it into a no-op (plain synchronous training).
        diloco: Run DiLoCo across replica groups with these settings (prepare the model and
            its one optimizer first, and create this before the training loop).

    Raises:
        UnsupportedFeatureError: Enabled in a job that is not single-process or DDP (FSDP,
            DeepSpeed, Megatron-LM, XLA); ``enabled=False`` is accepted there. With ``diloco``:
            DeepSpeed, Megatron-LM or XLA, or ``quantize=True`` without CUDA and triton.
        AcceleratorConfigError: ``local_sgd_steps`` is below 1; with ``diloco``: no replica
            groups, no prepared optimizer, or settings that do not fit ``local_sgd_steps``.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
        *,
        diloco: DiLoCoSettings | None = None,
    ) -> None:
        if diloco is not None and not isinstance(diloco, DiLoCoSettings):
            raise AcceleratorConfigError(
                f"LocalSGD(diloco={diloco!r}): pass accel.utils.DiLoCoSettings(...) or None."
            )
        supported = _SUPPORTED if diloco is None else _SUPPORTED_DILOCO
        if enabled and diloco is not None and accelerator.distributed_type not in supported:
            raise UnsupportedFeatureError(
                f"LocalSGD(diloco=...) trains each replica group with DDP or FSDP2, not "
                f"distributed_type={accelerator.distributed_type.value}; use DDP or FSDP2 "
                "inside the groups, or pass enabled=False."
            )
        if enabled and accelerator.distributed_type not in supported:
            raise UnsupportedFeatureError(
                f"LocalSGD supports single-process and DDP jobs, not distributed_type="
                f"{accelerator.distributed_type.value}; pass enabled=False or use plain DDP."
            )
        if local_sgd_steps < 1:
            raise AcceleratorConfigError(
                f"LocalSGD(local_sgd_steps={local_sgd_steps}): must be >= 1."
            )
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.diloco = diloco
        self._no_sync = contextlib.ExitStack()
        #: The DiLoCo schedule (``diloco`` given and enabled), else ``None``.
        self.rounds: OuterRounds | None = None
        if diloco is not None and enabled:
            self.enabled = True
            self.rounds = _diloco_rounds(accelerator, model, local_sgd_steps, diloco)
        else:
            self.enabled = enabled and accelerator.distributed_type != DistributedType.NO

    def __enter__(self) -> LocalSGD:
        if self.rounds is not None:
            self.rounds.training.start_rounds(self.rounds)
        elif self.enabled:
            self._no_sync.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.rounds is not None:
            try:
                if exc_type is None:
                    self.rounds.sync_all_fragments()
            finally:
                self.rounds.training.stop_rounds()
            return
        try:
            if self.enabled and exc_type is None:
                self._sync_and_avg_model_params()
        finally:
            self._no_sync.close()

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps``.

        With ``diloco``: sync the replica groups when the round's inner steps are done.
        """
        self.num_steps += 1
        if self.rounds is not None:
            self.rounds.inner_step_done()
        elif self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        """Replace every parameter by its mean across processes."""
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast(), torch.no_grad():
            for parameter in self.model.parameters():
                parameter.data = self.accelerator.reduce(parameter.data, reduction="mean")


def _diloco_rounds(
    accelerator: Accelerator,
    model: torch.nn.Module,
    local_sgd_steps: int,
    settings: DiLoCoSettings,
) -> OuterRounds:
    """The torchft DiLoCo over the prepared model and optimizer, on the job's replica groups.

    Raises:
        AcceleratorConfigError: No replica groups, or no prepared optimizer.
        UnsupportedFeatureError: ``quantize=True`` where torchft cannot quantize.
    """
    per_sync = settings.inner_steps_per_sync(local_sgd_steps)
    settings.check_device(accelerator.device)
    training = accelerator.replica_training
    if training is None:
        raise AcceleratorConfigError(
            "LocalSGD(diloco=DiLoCoSettings(...)) syncs replica groups, and this job has none "
            "(fault tolerance across replica groups is off). Start the script with `accel "
            "launch --ft_replicas N script.py` (N >= 2 groups), or pass "
            "Accelerator(fault_tolerance=FaultTolerancePlugin(...)); for Accelerate's "
            "LocalSGD within one job, drop diloco=."
        )
    optimizers = getattr(accelerator, "_optimizers", [])
    if len(optimizers) != 1:
        raise AcceleratorConfigError(
            f"LocalSGD(diloco=...) found {len(optimizers)} prepared optimizers; DiLoCo steps "
            "one inner optimizer: create it after accelerator.prepare(model, optimizer, ...)."
        )
    from accel_state.torchft_api import create_diloco

    fragments = split_into_fragments(accelerator.unwrap_model(model), settings.fragments)
    sync = create_diloco(
        training.manager,
        fragments,
        optimizers[0].optimizer,
        [settings.build_outer_optimizer(list(part.parameters())) for part in fragments],
        sync_every=local_sgd_steps,
        fragment_sync_delay=settings.fragment_sync_delay,
        fragment_update_alpha=settings.fragment_update_alpha,
        should_quantize=settings.quantize,
    )
    return OuterRounds(
        sync, training, per_sync, settings.fragment_sync_delay, device=accelerator.device
    )
