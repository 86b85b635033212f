"""The ``Accelerator``: one object that adapts a raw PyTorch training loop to any setup."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from accel.accelerator_state import AcceleratorState, state_reset_error
from accel.availability import is_bitsandbytes_multi_backend_available, is_xpu_available
from accel.checkpointing import CheckpointingMixin, make_project_configuration
from accel.errors import AcceleratorConfigError, PreparationError, UnsupportedFeatureError
from accel.fault_tolerance import FaultTolerance
from accel.fp8.recipes import FP8_HANDLER_TYPES
from accel.fp8.setup import FP8AttributesMixin, resolve_fp8
from accel.kernel_check import check_os_kernel
from accel.kwargs_handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    TorchDynamoPlugin,
)
from accel.memory import release_memory
from accel.modeling import patch_forward_for_precision, unwrap_model
from accel.optimizer import AcceleratedOptimizer
from accel.parallelism_mixin import ParallelismMixin
from accel.placement import ParameterMoves, move_model, switch_parameters
from accel.plugins import GradientAccumulationPlugin
from accel.precision import Precision
from accel.profiling import ProfileKwargs
from accel.replica_training import FaultTolerancePlugin, ReplicaGroupTraining
from accel.run_config import RunConfig
from accel.scheduler import AcceleratedScheduler
from accel.strategies import make_strategy
from accel.strategies.deepspeed.named_plugins import (
    DeepSpeedAcceleratorMixin,
    one_deepspeed_argument,
)
from accel.tracking.accelerator_mixin import TrackersMixin
from accel.tracking.base import GeneralTracker
from accel.tracking.resolve import filter_trackers, resolve_trackers
from accel.training_step import TrainingStepMixin
from accel.triggers import Trigger
from accel_ckpt import Checkpointer, ProjectConfiguration
from accel_data import (
    DataLoaderConfiguration,
    DataLoaderStateMixin,
    prepare_data_loader,
    skip_first_batches,
)
from accel_data.shared_position import SharedPositionLoader
from accel_state import GradientState

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: The default of the data-loading shortcuts (Accelerate's signature uses sentinels there too).
_UNSET: Any = object()
#: ``Accelerator(...)`` arguments that fall back to another source (the launcher, the dataloader
#: configuration) when left unset. One rule decides "unset": the argument holds its default in
#: the signature (``None``, ``1`` for ``gradient_accumulation_steps``, or the sentinel).
_DATALOADER_SHORTCUTS = (
    "split_batches",
    "even_batches",
    "dispatch_batches",
    "use_seedable_sampler",
)
_DEFERRING_ARGUMENTS = ("mixed_precision", "gradient_accumulation_steps", *_DATALOADER_SHORTCUTS)
_HANDLER_TYPES = (
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    AutocastKwargs,
    ProfileKwargs,
    *FP8_HANDLER_TYPES,
)


class Accelerator(
    CheckpointingMixin,
    DeepSpeedAcceleratorMixin,
    FP8AttributesMixin,
    ParallelismMixin,
    TrainingStepMixin,
    TrackersMixin,
):
    """Adapts a raw PyTorch training loop to one CPU, many processes, GPUs or XLA devices.

    Args:
        device_placement: Move prepared models and batches to :attr:`device`.
        split_batches: Split each batch across processes instead of giving each process whole
            batches (also settable through ``dataloader_config``).
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` (or ``"fp8"`` where supported);
            default: the launcher's setting, else ``"no"``.
        gradient_accumulation_steps: Micro-steps per optimizer step; left at its default (1),
            the launcher's value applies. Like every argument that defers to the launcher or to
            ``dataloader_config``, it counts as set only when it differs from its default.
        cpu: Force the CPU even when an accelerator is present.
        dataloader_config: A :class:`~accel_data.DataLoaderConfiguration`.
        rng_types: Random generators synchronised at each dataloader iteration
            (default ``["generator"]``).
        project_dir: Folder for checkpoints and logs.
        project_config: A :class:`~accel_ckpt.ProjectConfiguration` (checkpoint naming, limits).
        gradient_accumulation_plugin: Full accumulation settings; exclusive with
            ``gradient_accumulation_steps``.
        step_scheduler_with_optimizer: Step prepared schedulers only with real optimizer steps.
        kwargs_handlers: ``DistributedDataParallelKwargs``, ``GradScalerKwargs``,
            ``InitProcessGroupKwargs``, ``AutocastKwargs``, ``ProfileKwargs`` instances (one of
            each at most) and one fp8 recipe (``AORecipeKwargs``, ``TERecipeKwargs``,
            ``MSAMPRecipeKwargs`` or ``FP8RecipeKwargs``; see :mod:`accel.fp8`).
        dynamo_backend: ``torch.compile`` backend for prepared models (``"no"`` disables).
        log_with: Experiment trackers: ``"jsonl"``, ``"csv"``, ``"tensorboard"``, ``"wandb"``,
            ``"mlflow"``, ``"all"``, ``GeneralTracker`` instances, or a list of those (see
            :mod:`accel.tracking`).
        deepspeed_plugin: A :class:`~accel.DeepSpeedPlugin`, or a dict of named plugins (first
            selected; see :mod:`accel.strategies.deepspeed.named_plugins`); default: the launcher's settings.
        fsdp_plugin: FSDP settings (arrive with the FSDP strategy).
        even_batches: Shortcut for the ``DataLoaderConfiguration`` field of that name.
        dispatch_batches: Shortcut for the ``DataLoaderConfiguration`` field of that name.
        dynamo_plugin: Full ``torch.compile`` settings; exclusive with ``dynamo_backend``.
        deepspeed_plugins: Accelerate's other name for ``deepspeed_plugin``.
        parallelism_config: A :class:`~accel.ParallelismConfig`: N-D parallelism on one device
            mesh (HSDP, tensor and context parallelism with FSDP2); default: the launcher's
            (``--use_parallelism_config``). See :mod:`accel.parallelism`.
        torch_tp_plugin: Accelerate's older :class:`~accel.TorchTensorParallelPlugin`
            (``ParallelismConfig(tp_size=...)``).
        megatron_lm_plugin: Accepted for compatibility; anything but ``None`` raises
            :class:`UnsupportedFeatureError` naming why.
        use_seedable_sampler: Shortcut for the ``DataLoaderConfiguration`` field (Accelerate 0.x).
        logging_dir: Accelerate 0.x's spelling of ``project_dir`` (deprecated there too).
        fault_tolerance: A :class:`~accel.FaultTolerancePlugin`: per-step fault tolerance across
            replica groups (torchft); default: the launcher's (``accel launch --ft_replicas``).
            See :mod:`accel.replica_training`.

    Raises:
        AcceleratorConfigError: Contradictory arguments, or arguments that contradict the state
            already created in this process.
        UnsupportedFeatureError: A requested precision or strategy is not available here.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _UNSET,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        rng_types: Sequence[str] | None = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Sequence[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        log_with: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        even_batches: bool = _UNSET,
        dispatch_batches: bool | None = _UNSET,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        use_seedable_sampler: bool = _UNSET,
        logging_dir: str | None = None,
        fault_tolerance: FaultTolerancePlugin | None = None,
    ) -> None:
        _refuse_unsupported(megatron_lm_plugin=megatron_lm_plugin)
        given = _given_arguments(
            mixed_precision=mixed_precision,
            gradient_accumulation_steps=gradient_accumulation_steps,
            split_batches=split_batches,
            even_batches=even_batches,
            dispatch_batches=dispatch_batches,
            use_seedable_sampler=use_seedable_sampler,
        )
        deepspeed_plugin = one_deepspeed_argument(deepspeed_plugin, deepspeed_plugins)
        if logging_dir is not None:
            if project_dir is not None and str(project_dir) != str(logging_dir):
                raise AcceleratorConfigError(
                    f"logging_dir={logging_dir!r} and project_dir={project_dir!r} differ; "
                    "logging_dir is the old name of project_dir: pass project_dir only."
                )
            project_dir = logging_dir
        self.log_with = resolve_trackers(log_with)
        self.trackers: list[GeneralTracker] = []
        handlers = _sort_handlers(kwargs_handlers or ())
        self.ddp_handler: DistributedDataParallelKwargs | None = handlers.get(
            DistributedDataParallelKwargs
        )  # type: ignore[assignment]
        self.scaler_handler: GradScalerKwargs | None = handlers.get(GradScalerKwargs)  # type: ignore[assignment]
        self.init_handler: InitProcessGroupKwargs | None = handlers.get(InitProcessGroupKwargs)  # type: ignore[assignment]
        self.autocast_handler: AutocastKwargs | None = handlers.get(AutocastKwargs)  # type: ignore[assignment]
        self.profile_handler: ProfileKwargs | None = handlers.get(ProfileKwargs)  # type: ignore[assignment]

        if dynamo_backend is not None:
            if dynamo_plugin is not None:
                raise AcceleratorConfigError(
                    f"dynamo_backend={dynamo_backend!r} and dynamo_plugin were both given; "
                    "set the backend in the plugin only."
                )
            dynamo_plugin = TorchDynamoPlugin(backend=dynamo_backend)
        self.state = AcceleratorState(
            mixed_precision=given.get("mixed_precision"),
            cpu=cpu,
            dynamo_plugin=dynamo_plugin,
            deepspeed_plugin=deepspeed_plugin,
            fsdp_plugin=fsdp_plugin,
            backend=self.init_handler.backend if self.init_handler else None,
            timeout=self.init_handler.timeout if self.init_handler else None,
            parallelism_config=parallelism_config,
            torch_tp_plugin=torch_tp_plugin,
            _from_accelerator=True,
        )
        contract = self.state.partial.contract

        if gradient_accumulation_plugin is not None:
            if "gradient_accumulation_steps" in given:
                raise AcceleratorConfigError(
                    f"gradient_accumulation_steps={gradient_accumulation_steps} and "
                    "gradient_accumulation_plugin were both given; set num_steps in the plugin only."
                )
        else:
            steps = given.get("gradient_accumulation_steps", contract.gradient_accumulation_steps)
            gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)
        self.gradient_state = GradientState(gradient_accumulation_plugin)

        self.dataloader_config = _merge_dataloader_options(
            dataloader_config,
            {name: given[name] for name in _DATALOADER_SHORTCUTS if name in given},
        )
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]
        self.project_configuration = make_project_configuration(project_dir, project_config)
        self.log_with = filter_trackers(log_with, self.logging_dir)
        #: fp8's backend and recipe (Accelerate's ``fp8_*`` attributes read it).
        self._fp8 = resolve_fp8(handlers, self.state.mixed_precision, contract)
        #: Everything this Accelerator runs with, resolved once; the strategy, precision and
        #: checkpoint layers get what they need from it (never from the process-wide state).
        self.run_config = RunConfig(
            process=self.state.partial,
            distributed_type=self.state.distributed_type,
            mixed_precision=self.state.mixed_precision,
            gradient_accumulation_steps=self.gradient_state.num_steps,
            split_batches=self.dataloader_config.split_batches,
            gradient_state=self.gradient_state,
            fsdp_plugin=self.state.fsdp_plugin,
            deepspeed_plugins=self.state.deepspeed_registry,
            dynamo_plugin=self.state.dynamo_plugin,
            parallel_mesh=self.state.parallel_mesh,
            ddp_settings=self.ddp_handler.to_kwargs() if self.ddp_handler else {},
            fp8=self._fp8,
        )
        self.strategy = make_strategy(self.run_config)
        self.precision: Precision = self.strategy.make_precision(self.scaler_handler)
        self.scaler = self.precision.scaler
        self.step = 0
        # What save_state, load_state and replica healing cover (see training_objects).
        self.checkpointer = Checkpointer(self.project_configuration, unwrap=_WeakUnwrap(self))
        self._prepared_ids: dict[int, tuple[Any, Any]] = {}
        self._parameter_moves: ParameterMoves = {}
        self._trigger = Trigger(self.device)
        self.fault_tolerance = FaultTolerance(self.state.partial, strategy=self.strategy)
        plugin = (
            fault_tolerance.resolved()
            if fault_tolerance is not None
            else FaultTolerancePlugin.from_env()
        )
        #: Per-step fault tolerance across replica groups (``None``: not a replica-group job).
        self.replica_training = None if plugin is None else ReplicaGroupTraining(plugin, self)
        check_os_kernel()  # warns on Linux kernels older than 5.5, as Accelerate's does

    # ------------------------------------------------------------------ prepare
    def prepare(self, *args: Any, device_placement: Sequence[bool | None] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers for this setup.

        Objects come back in the order given (a single object unwrapped); objects of other types
        pass through unchanged. Preparing an object twice returns the first result.

        Args:
            *args: Any mix of ``nn.Module``, ``Optimizer``, ``DataLoader`` and LR schedulers.
            device_placement: One flag per object overriding the Accelerator's setting.
        """
        self._check_state_alive()
        placements = list(device_placement) if device_placement is not None else [None] * len(args)
        if len(placements) != len(args):
            raise PreparationError(
                f"device_placement has {len(placements)} entries for {len(args)} objects; "
                "give one per object."
            )
        args = tuple(self.precision.prepare_together(list(args)))
        result = list(args)
        kinds: list[tuple[Callable[[Any], bool], Callable[[Any, bool | None], Any]]] = [
            (lambda obj: isinstance(obj, torch.nn.Module), self.prepare_model),
            (lambda obj: isinstance(obj, torch.utils.data.DataLoader), self.prepare_data_loader),
            (lambda obj: isinstance(obj, torch.optim.Optimizer), self.prepare_optimizer),
            (_is_scheduler, lambda obj, _placement: self.prepare_scheduler(obj)),
        ]
        for matches, prepare in kinds:
            for index, obj in enumerate(args):
                if matches(obj):
                    result[index] = prepare(obj, placements[index])
        together = self.strategy.prepare_together(list(result), list(self._dataloaders))
        for before, after in zip(result, together, strict=True):
            if after is not before:
                self._replace_prepared(before, after)
        result = together
        return result[0] if len(result) == 1 else tuple(result)

    def _replace_prepared(self, before: Any, after: Any) -> None:
        """Record that the strategy replaced the prepared object ``before`` by ``after``."""
        self.training_objects.replace(before, after)
        for key, (original, prepared) in list(self._prepared_ids.items()):
            if prepared is before:
                self._prepared_ids[key] = (original, after)
        if isinstance(after, AcceleratedOptimizer) and after not in self._optimizers:
            self._optimizers.append(after)
        elif isinstance(after, AcceleratedScheduler) and after not in self._schedulers:
            self._schedulers.append(after)
        self._remember(after, after)

    def _already_prepared(self, obj: Any) -> Any:
        entry = self._prepared_ids.get(id(obj))
        # The entry holds the object itself, so its id cannot be reused while it is recorded.
        if entry is not None and entry[0] is obj:
            return entry[1]
        if getattr(obj, "_is_accelerate_prepared", False):
            # Prepared by another Accelerator (Accelerate's flag): adopt it as it is.
            self._adopt(obj)
            return obj
        return None

    def _adopt(self, prepared: Any) -> None:
        """Track an object that an earlier Accelerator prepared, as if this one had."""
        if isinstance(prepared, torch.nn.Module):
            registry: list[Any] = self._models
        elif isinstance(prepared, AcceleratedOptimizer):
            registry = self._optimizers
        elif isinstance(prepared, AcceleratedScheduler):
            registry = self._schedulers
        else:
            registry = self._dataloaders
        if not any(item is prepared for item in registry):
            registry.append(prepared)
        self._remember(prepared, prepared)

    def _remember(self, original: Any, prepared: Any) -> Any:
        self._prepared_ids[id(original)] = (original, prepared)
        self._prepared_ids[id(prepared)] = (prepared, prepared)
        # Accelerate's marker, which transformers and Accelerate's tests read.
        with contextlib.suppress(AttributeError, TypeError):
            prepared._is_accelerate_prepared = True
        return prepared

    def prepare_model(
        self,
        model: torch.nn.Module,
        device_placement: bool | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Place ``model`` on the device, apply mixed precision, wrap it for the strategy.

        Args:
            model: The model.
            device_placement: Override the Accelerator's ``device_placement``.
            evaluation_mode: Skip the distributed wrapper (inference only).
        """
        existing = self._already_prepared(model)
        if existing is not None:
            return existing  # type: ignore[no-any-return]
        placement = self.device_placement if device_placement is None else device_placement
        self._check_quantized_placement(model)
        placed_by_strategy = self.strategy.places_model_itself(model)
        if placement and not getattr(model, "hf_device_map", None) and not placed_by_strategy:
            self._parameter_moves.update(move_model(model, self.device))
        self._parameter_moves.update(self.precision.prepare_model(model))
        patch_forward_for_precision(model, self.precision, self.autocast_handler)
        if evaluation_mode:
            self.strategy.track_unwrapped(model)
            prepared = model
        else:
            prepared = self.strategy.wrap(model)
        prepared = self.strategy.compile(prepared, self.state.dynamo_plugin)
        self._models.append(prepared)
        return self._remember(model, prepared)  # type: ignore[no-any-return]

    def _check_quantized_placement(self, model: torch.nn.Module) -> None:
        """Refuse to train an 8-bit/4-bit model placed where it cannot be trained (as Accelerate).

        Raises:
            AcceleratorConfigError: The model is spread over several devices in a distributed job,
                sits on another device than this process's, or is offloaded to CPU or disk.
        """
        quantized = getattr(model, "is_loaded_in_8bit", False) or getattr(
            model, "is_loaded_in_4bit", False
        )
        device_map = getattr(model, "hf_device_map", None)
        if not quantized or not device_map:
            return
        devices = {
            str(device) if not isinstance(device, int) else device for device in device_map.values()
        }
        if len(devices) > 1 and self.state.partial.num_processes > 1:
            raise AcceleratorConfigError(
                "An 8-bit or 4-bit model spread over several devices cannot be trained in a "
                f"distributed job (device_map values {sorted(map(str, devices))}); run one process "
                "(naive pipeline parallelism), or load the model on one device per process."
            )
        if len(devices) == 1 and not devices & {"cpu", "disk"}:
            (only,) = devices
            index = only if isinstance(only, int) else torch.device(only).index
            multi_backend_cpu = (
                self.device.type == "cpu" and is_bitsandbytes_multi_backend_available()
            )
            same = (
                torch.device(self.device.type, index) == self.device if index is not None else True
            )
            if not multi_backend_cpu and not same and (self.device.index is not None or index != 0):
                raise AcceleratorConfigError(
                    f"The 8-bit or 4-bit model is on device {only!r} but this process trains on "
                    f"{self.device}; load it with device_map={{'': {self.device.index or 0}}}."
                )
        cpu_offload = "cpu" in devices and (
            not is_bitsandbytes_multi_backend_available() or is_xpu_available()
        )
        if cpu_offload or "disk" in devices:
            raise AcceleratorConfigError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision with "
                "CPU or disk offload (device_map values "
                f"{sorted(map(str, devices))}). Load it on the accelerator only, or install "
                "bitsandbytes with multi-backend support to train it on the CPU."
            )

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` in an :class:`AcceleratedOptimizer`."""
        if isinstance(optimizer, AcceleratedOptimizer):
            return optimizer
        existing = self._already_prepared(optimizer)
        if existing is not None:
            return existing  # type: ignore[no-any-return]
        placement = self.device_placement if device_placement is None else device_placement
        # On XLA, moving a model made new parameters; an optimizer built before prepare must
        # step those, not the host tensors it was given.
        switch_parameters(optimizer, self._parameter_moves)
        self.strategy.prepare_optimizer(optimizer)
        self.precision.prepare_optimizer(optimizer)
        prepared = AcceleratedOptimizer(
            optimizer, device_placement=placement, precision=self.precision, strategy=self.strategy
        )
        prepared.step_observer = self.fault_tolerance
        self._optimizers.append(prepared)
        if self.replica_training is not None:
            self.replica_training.check_optimizer(self._optimizers)
            prepared.commit_gate = self.replica_training.finish_step
        return self._remember(optimizer, prepared)  # type: ignore[no-any-return]

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` in an :class:`AcceleratedScheduler` tied to its prepared optimizer."""
        if isinstance(scheduler, AcceleratedScheduler):
            return scheduler
        existing = self._already_prepared(scheduler)
        if existing is not None:
            return existing  # type: ignore[no-any-return]
        raw_optimizer = getattr(scheduler, "optimizer", None)
        followed = [
            opt
            for opt in self._optimizers
            if opt.optimizer is raw_optimizer or opt is raw_optimizer
        ]
        prepared = AcceleratedScheduler(
            scheduler,
            followed or self._optimizers,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            num_processes=self.state.partial.data_parallel_size,
        )
        self._schedulers.append(prepared)
        return self._remember(scheduler, prepared)  # type: ignore[no-any-return]

    def prepare_data_loader(
        self,
        data_loader: torch.utils.data.DataLoader[Any],
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable[..., Any] | None = None,
    ) -> Any:
        """Shard ``data_loader`` across processes (see :func:`accel_data.prepare_data_loader`)."""
        existing = self._already_prepared(data_loader)
        if existing is not None:
            return existing
        config = self.dataloader_config
        placement = self.device_placement if device_placement is None else device_placement
        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=self.state.partial.data_parallel_size,
            process_index=self.state.partial.data_parallel_process_index,
            split_batches=config.split_batches,
            put_on_device=placement,
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
        )
        if isinstance(prepared, DataLoaderStateMixin):
            prepared.fetch_observer = self.fault_tolerance  # the slow-rank report's data clock
        if self.replica_training is not None:
            prepared = self.replica_training.wrap_dataloader(data_loader, in_group=prepared)
        self._dataloaders.append(prepared)
        return self._remember(data_loader, prepared)

    # ------------------------------------------------------------------ models
    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
    ) -> torch.nn.Module:
        """The user's model inside any distributed or strategy wrapper.

        Args:
            model: A prepared model.
            keep_fp32_wrapper: Keep the mixed-precision forward patch.
            keep_torch_compile: Return it still compiled when ``dynamo_backend`` (or the user)
                compiled it, as Accelerate does; False returns the plain module.
        """
        return unwrap_model(
            model,
            keep_fp32_wrapper=keep_fp32_wrapper,
            unwrappers=[self.strategy.unwrap],
            keep_torch_compile=keep_torch_compile,
        )

    def _plain_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module whose state dict is saved: no wrapper at all, compile included."""
        return self.unwrap_model(model, keep_torch_compile=False)

    # ------------------------------------------------------------------ process control

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A dataloader that skips its first ``num_batches`` batches (for mid-epoch resume).

        Under fault tolerance a training dataloader resumes at its loaded shared position by
        itself, and is returned as it is.
        """
        if isinstance(dataloader, SharedPositionLoader):
            return dataloader
        return skip_first_batches(dataloader, num_batches=num_batches)

    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop references to everything prepared and release cached device memory.

        Returns:
            A list of ``None`` of the same length as ``objects``, to rebind them.
        """
        self.training_objects.clear()
        self._prepared_ids.clear()
        self._parameter_moves.clear()
        self.strategy.free_memory()
        self.step = 0
        return release_memory(*objects)

    def clear(self, *objects: Any) -> list[Any]:
        """Alias of :meth:`free_memory`."""
        return self.free_memory(*objects)

    # ------------------------------------------------------------------ profiling

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the block with ``torch.profiler``; yields the profiler.

        With ``output_trace_dir`` set, each rank writes its Chrome trace
        ``profile_<rank>.json`` there when the block ends.

        Args:
            profile_handler: Settings for this block; default: the ``ProfileKwargs`` given in
                ``kwargs_handlers``, else torch's defaults.
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        path = handler.trace_path(self.process_index)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        profiler.export_chrome_trace(path)
        self.wait_for_everyone()

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` (or a submodule) was dispatched over several devices by a device map.

        Such a model must not be wrapped for distributed training (Accelerate checks the same).
        """
        for module in model.modules():
            device_map = getattr(module, "hf_device_map", None)
            if isinstance(device_map, dict) and len(set(device_map.values())) > 1:
                return True
        return False

    def _check_state_alive(self) -> None:
        """Raise when ``AcceleratorState._reset_state()`` ran after this Accelerator was made."""
        if not self.state.initialized:
            raise state_reset_error("mixed_precision")

    def __repr__(self) -> str:
        return f"Accelerator(\n{self.state!r})"


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step")
        and hasattr(obj, "optimizer")
        and hasattr(obj, "state_dict")
        and not isinstance(obj, (torch.optim.Optimizer, torch.nn.Module))
    )


_UNSUPPORTED_ARGUMENTS = {
    "megatron_lm_plugin": "Megatron-LM is not a target of accel (use FSDP or DeepSpeed)",
}


def _refuse_unsupported(**arguments: Any) -> None:
    for name, value in arguments.items():
        if value is not None:
            raise UnsupportedFeatureError(
                f"Accelerator({name}={value!r}): {_UNSUPPORTED_ARGUMENTS[name]}; leave it None."
            )


def _sort_handlers(handlers: Sequence[KwargsHandler]) -> dict[type, KwargsHandler]:
    found: dict[type, KwargsHandler] = {}
    for handler in handlers:
        kind = next((cls for cls in _HANDLER_TYPES if isinstance(handler, cls)), None)
        if kind is None:
            raise AcceleratorConfigError(
                f"kwargs_handlers got {handler!r}; accepted: "
                f"{', '.join(cls.__name__ for cls in _HANDLER_TYPES)}."
            )
        if kind in found:
            raise AcceleratorConfigError(
                f"kwargs_handlers holds two {kind.__name__} objects; pass one of each kind."
            )
        found[kind] = handler
    return found


def _given_arguments(**arguments: Any) -> dict[str, Any]:
    """The arguments that differ from their default in ``Accelerator``'s signature (set ones).

    Raises:
        KeyError: An argument not in :data:`_DEFERRING_ARGUMENTS` (a programming error).
    """
    defaults = _signature_defaults()
    return {
        name: value
        for name, value in arguments.items()
        if not (
            value is defaults[name] or (defaults[name] is not _UNSET and value == defaults[name])
        )
    }


@functools.cache
def _signature_defaults() -> dict[str, Any]:
    parameters = inspect.signature(Accelerator.__init__).parameters
    return {name: parameters[name].default for name in _DEFERRING_ARGUMENTS}


def _merge_dataloader_options(
    config: DataLoaderConfiguration | None, changes: dict[str, Any]
) -> DataLoaderConfiguration:
    """``dataloader_config`` (or the defaults) with the shortcut arguments that were set.

    Raises:
        AcceleratorConfigError: A shortcut contradicts the same field of ``dataloader_config``.
    """
    base = config or DataLoaderConfiguration()
    if config is not None:
        for name, value in changes.items():
            if getattr(config, name) != value:
                raise AcceleratorConfigError(
                    f"{name}={value!r} contradicts dataloader_config.{name}={getattr(config, name)!r}; "
                    "set it in one place."
                )
    return dataclasses.replace(base, **changes) if changes else base


class _WeakUnwrap:
    """``accelerator._plain_model`` without a strong reference to ``accelerator``.

    The checkpointer keeps it; a bound method would make a cycle, and an Accelerator (with
    its prepared objects) would outlive its last user until the garbage collector ran. It
    pickles as a new weak reference to the (unpickled) Accelerator.
    """

    def __init__(self, accelerator: Accelerator | None) -> None:
        self._accelerator = None if accelerator is None else weakref.ref(accelerator)

    def __call__(self, model: torch.nn.Module) -> torch.nn.Module:
        accelerator = None if self._accelerator is None else self._accelerator()
        return model if accelerator is None else accelerator._plain_model(model)

    def __reduce__(self) -> tuple[Any, ...]:
        accelerator = None if self._accelerator is None else self._accelerator()
        return (_WeakUnwrap, (accelerator,))
