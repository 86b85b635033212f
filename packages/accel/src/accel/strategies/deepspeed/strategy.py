"""DeepSpeed ZeRO 0-3: ``prepare`` builds one engine from the model, optimizer and scheduler.

The loop keeps its meaning: ``accelerator.backward`` runs ``engine.backward`` (the engine divides
by the accumulation steps) and, on synchronising micro-steps, ``engine.step`` (optimizer step,
clipping, gradient zeroing); the prepared optimizer's ``step``/``zero_grad`` then do nothing.
A user's torch scheduler stays an :class:`~accel.AcceleratedScheduler` (stepped as under DDP);
a :class:`~accel.utils.DummyScheduler` becomes the engine's own. deepspeed is imported here only.

One training engine per Accelerator (``accelerator.deepspeed_engine_wrapped``); models prepared
without an optimizer under another selected plugin become inference engines beside it (see
:mod:`accel.strategies.deepspeed.named_plugins`), saved and loaded with the training state as full weights.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from accel.errors import AcceleratorConfigError, PreparationError, UnsupportedFeatureError
from accel.kwargs_handlers import GradScalerKwargs
from accel.optimizer import AcceleratedOptimizer
from accel.precision import Precision
from accel.run_config import RunConfig
from accel.scheduler import AcceleratedScheduler
from accel.strategies.base import ModelStrategy
from accel.strategies.deepspeed.build_locks import warn_about_stale_build_locks
from accel.strategies.deepspeed.checkpoint import EngineCheckpoint
from accel.strategies.deepspeed.config import KnownValues, resolve_config
from accel.strategies.deepspeed.inputs import cast_inputs_for_bf16
from accel.strategies.deepspeed.named_plugins import DeepSpeedPluginRegistry
from accel.strategies.deepspeed.plugin import (
    DeepSpeedEngineWrapper,
    DeepSpeedPlugin,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    import_deepspeed,
    require_deepspeed,
)
from accel_ckpt import IncompleteCheckpointError, ShardedState
from accel_state import PartialState
from accel_state.group_keeper import GroupHolders
from accel_state.process_group import release_group_references


def is_engine(obj: Any) -> bool:
    """Whether ``obj`` is a DeepSpeed engine (checked without importing deepspeed)."""
    return any(cls.__name__ == "DeepSpeedEngine" for cls in type(obj).__mro__)


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The engine's optimizer: ``step``/``zero_grad`` are done by the engine inside ``backward``."""

    def __init__(self, optimizer: Any, engine: Any) -> None:
        super().__init__(optimizer, device_placement=False)
        self.engine = engine

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: the engine zeroes gradients after its step."""

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """Record whether the engine's last step was skipped (fp16 overflow); it already ran."""
        if self.gradient_state.sync_gradients:
            self._step_was_skipped = not self.engine.was_step_applied()


class DeepSpeedStrategy(ModelStrategy):
    """Builds a ``deepspeed.initialize`` engine at ``prepare`` (one model per Accelerator).

    Settings come from ``Accelerator(deepspeed_plugin=...)``, else from the launcher
    (``accel launch --use_deepspeed``, ``deepspeed_config:`` in the config YAML).
    """

    name = "DeepSpeed"
    engine_owns_gradients = True

    @property
    def phases_without_waiting(self) -> frozenset[str]:
        """Data only: the engine's backward and step reduce and gather across processes."""
        return frozenset({"data"})

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        require_deepspeed()
        warn_about_stale_build_locks()  # DeepSpeed compiles its ops on first use
        registry = config.deepspeed_plugins
        if registry is None:
            raise AcceleratorConfigError(
                "The DeepSpeed strategy needs the process's DeepSpeed plugin registry "
                "(RunConfig.deepspeed_plugins); build it through Accelerator(...)."
            )
        self.registry = registry
        plugin = registry.active
        if plugin is None:
            plugin = DeepSpeedPlugin.from_launch_config(self.state.contract.deepspeed_config)
            registry.active = plugin
        self.plugin: DeepSpeedPlugin = plugin
        self.mixed_precision = config.mixed_precision.value
        self.gradient_state = config.gradient_state
        # What this Accelerator asked for; the plugin selected at prepare may set its own.
        self._requested_steps = config.gradient_accumulation_steps
        live = registry.live_engines()
        try:
            steps = registry.accumulation_steps(plugin, self._requested_steps)
        except AcceleratorConfigError:
            if live:  # this Accelerator's settings already reached the shared GradientState
                self.gradient_state.plugin_kwargs["num_steps"] = live[0][
                    1
                ].gradient_accumulation_steps()
            raise
        self.gradient_state.plugin_kwargs["num_steps"] = steps
        # The training engine that backward drives (Accelerate's deepspeed_engine_wrapped).
        self.engine_wrapped: DeepSpeedEngineWrapper | None = None
        # Inference engines built under another selected plugin (see accel.strategies.deepspeed.named_plugins).
        self.inference_engines: list[Any] = []
        self._warned_no_clipping = False

    def make_precision(self, scaler_kwargs: GradScalerKwargs | None = None) -> Precision:
        """Full precision on the Accelerator's side: the engine applies the mode itself.

        The mode reaches the engine through its config's ``fp16``/``bf16`` blocks; fp8 is refused
        (the base class names the alternatives).
        """
        if self.config.fp8 is not None and self.config.fp8.enabled:
            return super().make_precision(scaler_kwargs)
        return Precision(self.state.device)

    @property
    def engine(self) -> Any:
        """The training engine (``None`` before ``prepare``)."""
        return None if self.engine_wrapped is None else self.engine_wrapped.engine

    # ------------------------------------------------------------------ prepare
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Nothing yet: the engine is built once the whole ``prepare`` call is seen."""
        return model

    def prepare_together(self, prepared: list[Any], dataloaders: Sequence[Any]) -> list[Any]:
        """Build the engine from the model, optimizer and scheduler of this ``prepare`` call."""
        models = [
            index
            for index, obj in enumerate(prepared)
            if isinstance(obj, torch.nn.Module)
            and not is_engine(obj)
            and any(parameter.requires_grad for parameter in obj.parameters())
        ]
        optimizers = [
            index
            for index, obj in enumerate(prepared)
            if isinstance(obj, DummyOptim)
            or (
                isinstance(obj, AcceleratedOptimizer)
                and not isinstance(obj, DeepSpeedOptimizerWrapper)
            )
        ]
        schedulers = [
            index
            for index, obj in enumerate(prepared)
            if isinstance(obj, DummyScheduler)
            or (
                isinstance(obj, AcceleratedScheduler)
                and not isinstance(obj, DeepSpeedSchedulerWrapper)
            )
        ]
        selected = _selected_plugin(self.registry, self.plugin)
        if self.engine is not None and selected is not self.plugin and not optimizers:
            return self._prepare_inference(prepared, selected)
        if not models:
            if optimizers:
                raise PreparationError(
                    "Under DeepSpeed the optimizer must be passed to the same accelerator.prepare "
                    "call as its model (the engine is built from both)."
                )
            return prepared
        if len(models) > 1 or len(optimizers) > 1:
            raise PreparationError(
                f"Under DeepSpeed one prepare call builds one engine: got {len(models)} trainable "
                f"models and {len(optimizers)} optimizers; pass one of each."
            )
        if self.engine is not None:
            raise PreparationError(
                "This Accelerator already holds a DeepSpeed engine; a second model (or the same "
                "model prepared again, whose ZeRO-3 parameters are sharded) cannot get another: "
                "its backward drives one engine. Prepare each model once, with its optimizer, in "
                "one call; train a second model through a second Accelerator() (after "
                "accelerator.state.select_deepspeed_plugin(name)), or prepare a model without an "
                "optimizer under another selected plugin for inference."
            )
        self.registry.check_plugin_can_train(selected)
        steps = self.registry.accumulation_steps(selected, self._requested_steps)
        self.gradient_state.plugin_kwargs["num_steps"] = steps
        result = list(prepared)
        self.plugin = selected
        engine, optimizer, scheduler = self._initialize(
            self.plugin,
            prepared[models[0]],
            prepared[optimizers[0]] if optimizers else None,
            prepared[schedulers[0]] if schedulers else None,
            [obj for obj in prepared if any(obj is dl for dl in dataloaders)] or list(dataloaders),
        )
        result[models[0]] = engine
        if optimizers:
            result[optimizers[0]] = optimizer
        for index in schedulers:
            current = result[index]
            if isinstance(current, DummyScheduler):
                if scheduler is None:
                    raise AcceleratorConfigError(
                        "DummyScheduler was passed but the DeepSpeed config defines no scheduler and "
                        "no lr_scheduler_callable was given; add a scheduler block or pass one."
                    )
                result[index] = DeepSpeedSchedulerWrapper(scheduler, [optimizer])
            elif optimizer is not None:
                current.optimizers = [optimizer]
        return result

    def _prepare_inference(self, prepared: list[Any], plugin: DeepSpeedPlugin) -> list[Any]:
        """Models prepared (without an optimizer) under another selected plugin: inference engines.

        The training engine stays the one ``backward`` and ``save_state`` use.
        """
        result = list(prepared)
        for index, obj in enumerate(prepared):
            if isinstance(obj, torch.nn.Module) and not is_engine(obj):
                engine, _, _ = self._initialize(
                    plugin, obj, None, None, [], self._training_micro_batch(), training=False
                )
                self.inference_engines.append(engine)
                result[index] = engine
        return result

    def _training_micro_batch(self) -> int | None:
        micro = getattr(self.engine, "train_micro_batch_size_per_gpu", None)
        return int(micro()) if callable(micro) else None

    def _initialize(
        self,
        plugin: DeepSpeedPlugin,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any,
        dataloaders: Sequence[Any],
        micro_batch: int | None = None,
        *,
        training: bool = True,
    ) -> tuple[Any, Any, Any]:
        if self.state.device.type == "cpu":  # DeepSpeed's CPU accelerator (gloo, C++ CPU ops)
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        deepspeed = import_deepspeed()
        per_process = [
            max(1, int(total) // self.state.num_processes)
            for loader in dataloaders
            if (total := getattr(loader, "total_batch_size", None)) is not None
        ]
        # Several dataloaders (train and eval): the plugin picks the smallest or the largest.
        pick = min if plugin.is_train_batch_min else max
        micro = pick(per_process) if per_process else micro_batch
        known = KnownValues(
            micro_batch_size=micro,
            gradient_accumulation_steps=self.gradient_state.num_steps,
            mixed_precision=self.mixed_precision,
            world_size=self.state.num_processes,
            split_batches=self.config.split_batches,
        )
        dummy_optimizer = optimizer if isinstance(optimizer, DummyOptim) else None
        dummy_scheduler = scheduler if isinstance(scheduler, DummyScheduler) else None
        config = resolve_config(plugin, known, dummy_optimizer, dummy_scheduler, model=model)
        plugin._resolved = config
        kwargs: dict[str, Any] = {"model": model, "config": config}
        if isinstance(optimizer, AcceleratedOptimizer):
            kwargs["optimizer"] = optimizer.optimizer
        elif dummy_optimizer is not None:
            kwargs["model_parameters"] = dummy_optimizer.params
        if dummy_scheduler is not None and "scheduler" not in config:
            kwargs["lr_scheduler"] = dummy_scheduler.lr_scheduler_callable
        _ensure_process_group(deepspeed, self.state)
        engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(**kwargs)
        _ENGINES.add(engine)
        cast_inputs_for_bf16(engine, config)
        if training:  # inference engines (another plugin) stay out of backward
            self.engine_wrapped = DeepSpeedEngineWrapper(engine)
            self.registry.register_engine(plugin, engine)
        wrapper = (
            None
            if engine_optimizer is None
            else DeepSpeedOptimizerWrapper(engine_optimizer, engine)
        )
        return engine, wrapper, engine_scheduler

    def free_memory(self) -> None:
        """Destroy the training engine (as Accelerate does) and drop every engine.

        The next ``prepare`` may build a new one, under any plugin.
        """
        engine = self.engine
        if engine is not None:
            self.registry.forget_engine(engine)
            engine.destroy()
        self.engine_wrapped = None
        self.inference_engines = []

    # ------------------------------------------------------------------ training step
    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The user's module inside an engine."""
        return model.module if is_engine(model) else None  # type: ignore[return-value]

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """The engine decides from the accumulation boundary; nothing to enter."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``engine.backward``; on a synchronising micro-step also ``engine.step``."""
        wrapped = self._require_wrapper()
        wrapped.backward(loss, sync_gradients=self.gradient_state.sync_gradients, **kwargs)

    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """The engine clips at its configured ``gradient_clipping``; returns the last global norm.

        ``parameters`` and ``norm_type`` are the engine's: it clips every parameter by the 2-norm.
        An engine configured without clipping does not clip: as in Accelerate, the norm is
        returned (with a warning, once) — transformers' ``Trainer`` asks for its
        ``max_grad_norm`` under ``accel launch --use_deepspeed`` without ``--gradient_clipping``.

        Raises:
            AcceleratorConfigError: The engine clips, at another value than ``max_norm``.
        """
        wrapped = self._require_wrapper()
        configured = float(wrapped.engine.gradient_clipping() or 0.0)
        if configured == 0.0 and max_norm != float("inf"):
            if not self._warned_no_clipping:
                self._warned_no_clipping = True
                warnings.warn(
                    f"clip_grad_norm_(max_norm={max_norm}) under DeepSpeed: the engine is configured "
                    "without gradient_clipping, so gradients are not clipped (as in Accelerate); set "
                    "gradient_clipping in the DeepSpeed config (or DeepSpeedPlugin(gradient_clipping="
                    "...), --gradient_clipping) to clip.",
                    stacklevel=3,
                )
        elif configured != float(max_norm) and max_norm != float("inf"):
            raise AcceleratorConfigError(
                f"clip_grad_norm_(max_norm={max_norm}) under DeepSpeed: the engine clips inside its "
                f"step at gradient_clipping={configured}; set DeepSpeedPlugin(gradient_clipping="
                f"{max_norm}) or gradient_clipping in the config file (or --gradient_clipping)."
            )
        norm = wrapped.get_global_grad_norm()  # None before the first step
        return torch.as_tensor(float("nan") if norm is None else norm)

    def clip_grad_value_(self, parameters: list[torch.Tensor], clip_value: float) -> None:
        """Not available: the engine owns gradients and clips by norm only.

        Raises:
            UnsupportedFeatureError: Always.
        """
        raise UnsupportedFeatureError(
            f"clip_grad_value_(clip_value={clip_value}) is not supported under DeepSpeed; use "
            "gradient_clipping (norm) in the DeepSpeedPlugin or the config file."
        )

    # ------------------------------------------------------------------ checkpoints and weights
    def checkpoint_split(
        self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any]
    ) -> tuple[list[torch.nn.Module], list[Any], list[ShardedState]]:
        """The training engine goes through ``engine.save_checkpoint``, inference engines as weights.

        DeepSpeed cannot checkpoint an engine without an optimizer, so each inference engine's
        full weights (ZeRO-3 shards gathered) are saved beside it.
        """
        sharded: list[ShardedState] = [
            InferenceEngineWeights(
                engine, f"deepspeed_inference_{index}", self.state.is_main_process
            )
            for index, engine in enumerate(self.inference_engines)
        ]
        if self.engine is not None:
            sharded.insert(0, EngineCheckpoint(self.engine))
        if not sharded:
            return list(models), list(optimizers), []
        plain_models = [
            model
            for model in models
            if model is not self.engine and not any(model is e for e in self.inference_engines)
        ]
        plain_optimizers = [
            optimizer
            for optimizer in optimizers
            if not (
                isinstance(optimizer, DeepSpeedOptimizerWrapper) and optimizer.engine is self.engine
            )
        ]
        return plain_models, plain_optimizers, sharded

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on the CPU, on every rank (ZeRO-3 shards gathered first)."""
        module = self.unwrap(model) or model
        engine = next(
            (
                engine
                for engine in (self.engine, *self.inference_engines)
                if engine is not None and module is engine.module
            ),
            None,
        )
        if engine is None:
            return {
                name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()
            }
        return gathered_weights(engine)

    def _require_wrapper(self) -> DeepSpeedEngineWrapper:
        if self.engine_wrapped is None:
            raise PreparationError(
                "No DeepSpeed engine yet: pass the model (and its optimizer) to accelerator.prepare first."
            )
        return self.engine_wrapped


def gathered_weights(engine: Any) -> dict[str, torch.Tensor]:
    """The engine's full module weights on the CPU, on every rank (ZeRO-3 shards gathered)."""
    module = engine.module
    context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if engine.zero_optimization_partition_weights():
        deepspeed = import_deepspeed()
        context = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
    with context:
        return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}


class InferenceEngineWeights:
    """An inference engine's full weights as one safetensors file in the checkpoint.

    Saved gathered (rank 0 writes); loaded on every rank, through ``GatheredParameters`` under
    ZeRO-3 so the loaded values are sharded again on exit.
    """

    file = "model.safetensors"

    def __init__(self, engine: Any, name: str, writes: bool) -> None:
        self.engine = engine
        self.name = name
        self.writes = writes

    def save(self, folder: Path) -> None:
        """Gather the weights (every rank) and write them (rank 0)."""
        from safetensors.torch import save_file

        weights = gathered_weights(self.engine)
        if self.writes:
            save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / self.file))

    def load(self, folder: Path) -> None:
        """Load the weights into the engine's module (every rank).

        Raises:
            IncompleteCheckpointError: ``folder`` holds no weights file.
        """
        from safetensors.torch import load_file

        path = folder / self.file
        if not path.is_file():
            raise IncompleteCheckpointError(
                f"{folder} holds no {self.file} for the DeepSpeed inference engine {self.name!r}; "
                "was the state saved with the same models prepared?"
            )
        weights = load_file(str(path))
        module = self.engine.module
        context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.engine.zero_optimization_partition_weights():
            deepspeed = import_deepspeed()
            context = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0)
        with context, torch.no_grad():
            module.load_state_dict(weights)


def _ensure_process_group(deepspeed: Any, state: PartialState) -> None:
    """Let deepspeed use accel's process group; a single process gets a one-rank group."""
    if not state.use_distributed:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    deepspeed.init_distributed(dist_backend=state.backend or "gloo", auto_mpi_discovery=False)
    _forget_stale_groups()


def _release_engine_groups(engines: list[Any]) -> None:
    """Drop destroyed groups from DeepSpeed engines and DeepSpeed's cached groups."""
    roots: list[Any] = list(engines)
    cached_groups = sys.modules.get("deepspeed.utils.groups")
    if cached_groups is not None:  # DeepSpeed's cached world and data-parallel groups
        roots.append(vars(cached_groups))
    release_group_references(*roots)


# Every DeepSpeed engine this process made: its modules and optimizer hold the engine's groups.
_ENGINES = GroupHolders(_release_engine_groups)


def _forget_stale_groups() -> None:
    """Drop DeepSpeed's cached process groups when they belong to a destroyed default group.

    DeepSpeed clones the world group once per process (``deepspeed.utils.groups``); after the
    default group is destroyed and started again (``reset_state()``, then a new Accelerator),
    that clone is no longer registered and building an engine fails in ``get_global_rank``.
    """
    import torch.distributed as dist
    from deepspeed.utils import groups

    world = getattr(groups, "_WORLD_GROUP", None)
    if world is None:
        return
    try:
        dist.get_global_rank(world, 0)
    except (ValueError, RuntimeError, KeyError):
        groups._WORLD_GROUP = None
        for name in ("_ZERO_PARAM_INTRA_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP"):
            if getattr(groups, name, None) is not None:
                setattr(groups, name, None)
        for name in (
            "_EXPERT_PARALLEL_GROUP",
            "_EXPERT_PARALLEL_GROUP_RANKS",
            "_EXPERT_DATA_PARALLEL_GROUP",
            "_EXPERT_DATA_PARALLEL_GROUP_RANKS",
            "_ALL_TO_ALL_GROUP",
        ):
            cached = getattr(groups, name, None)
            if isinstance(cached, dict):
                cached.clear()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _selected_plugin(
    registry: DeepSpeedPluginRegistry, default: DeepSpeedPlugin
) -> DeepSpeedPlugin:
    """The plugin selected in ``registry`` now (several plugins), else ``default``."""
    selected = registry.active
    return selected if isinstance(selected, DeepSpeedPlugin) else default
