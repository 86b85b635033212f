"""DeepSpeed ZeRO 0-3: ``prepare`` builds one engine from the model, optimizer and scheduler.

The loop keeps its meaning: ``accelerator.backward`` runs ``engine.backward`` (the engine divides
by the accumulation steps) and, on synchronising micro-steps, ``engine.step`` (optimizer step,
clipping, gradient zeroing); the prepared optimizer's ``step``/``zero_grad`` then do nothing.
A user's torch scheduler stays an :class:`~accel.AcceleratedScheduler` (stepped as under DDP);
a :class:`~accel.utils.DummyScheduler` becomes the engine's own. deepspeed is imported here only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from accel.errors import AcceleratorConfigError, PreparationError, UnsupportedFeatureError
from accel.optimizer import AcceleratedOptimizer
from accel.scheduler import AcceleratedScheduler
from accel.strategies.base import ModelStrategy
from accel.strategies.deepspeed_config import KnownValues, accumulation_steps, resolve_config
from accel.strategies.deepspeed_inputs import cast_inputs_for_bf16
from accel.utils.build_locks import warn_about_stale_build_locks
from accel.utils.deepspeed import (
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    import_deepspeed,
    require_deepspeed,
)
from accel_ckpt import IncompleteCheckpointError, ShardedState
from accel_state import GradientState, PartialState


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


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the engine built from the config file: the engine steps it."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the engine steps its scheduler with each optimizer step."""


class DeepSpeedStrategy(ModelStrategy):
    """Builds a ``deepspeed.initialize`` engine at ``prepare`` (one model per Accelerator).

    Settings come from ``Accelerator(deepspeed_plugin=...)``, else from the launcher
    (``accel launch --use_deepspeed``, ``deepspeed_config:`` in the config YAML).
    """

    name = "DeepSpeed"
    engine_owns_gradients = True
    owns_mixed_precision = True

    def __init__(self, state: PartialState, **settings: Any) -> None:
        super().__init__(state)
        from accel.state import AcceleratorState

        require_deepspeed()
        warn_about_stale_build_locks()  # DeepSpeed compiles its ops on first use
        accelerator_state = AcceleratorState()
        plugin = accelerator_state.deepspeed_plugin
        if plugin is None:
            plugin = DeepSpeedPlugin.from_launch_config(state.contract.deepspeed_config)
            accelerator_state._shared_state["deepspeed_plugin"] = plugin
        self.plugin: DeepSpeedPlugin = plugin
        self.mixed_precision = accelerator_state.mixed_precision.value
        gradient_state = GradientState()
        steps = accumulation_steps(plugin, gradient_state.num_steps)
        gradient_state.plugin_kwargs["num_steps"] = steps
        self.engine: Any = None
        # Inference engines built under another selected plugin (see accel.deepspeed_plugins).
        self.inference_engines: list[Any] = []
        self._unzero_norm: float | None = None

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
        selected = _selected_plugin(self.plugin)
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
                "model prepared again, whose ZeRO-3 parameters are sharded) cannot get another. "
                "Prepare each model once, with its optimizer, in one call."
            )
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
            gradient_accumulation_steps=GradientState().num_steps,
            mixed_precision=self.mixed_precision,
            world_size=self.state.num_processes,
        )
        dummy_optimizer = optimizer if isinstance(optimizer, DummyOptim) else None
        dummy_scheduler = scheduler if isinstance(scheduler, DummyScheduler) else None
        config = resolve_config(plugin, known, dummy_optimizer, dummy_scheduler)
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
        cast_inputs_for_bf16(engine, config)
        if training:  # inference engines (another plugin) stay out of backward and save_state
            self.engine = engine
        wrapper = (
            None
            if engine_optimizer is None
            else DeepSpeedOptimizerWrapper(engine_optimizer, engine)
        )
        return engine, wrapper, engine_scheduler

    def free_memory(self) -> None:
        """Drop the engines, so the next ``prepare`` may build a new one."""
        self.engine = None
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
        engine = self._require_engine()
        sync = GradientState().sync_gradients
        engine.set_gradient_accumulation_boundary(sync)
        engine.backward(loss, **kwargs)
        if sync:
            if engine.zero_optimization_stage() == 0 and engine.gradient_clipping() > 0:
                # Without ZeRO the engine clips but keeps no norm: take it from the reduced grads.
                self._unzero_norm = _total_norm(engine.module.parameters())
            engine.step()

    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """The engine clips at its configured ``gradient_clipping``; returns the last global norm.

        ``parameters`` and ``norm_type`` are the engine's: it clips every parameter by the 2-norm.

        Raises:
            AcceleratorConfigError: ``max_norm`` differs from the engine's clipping value.
        """
        engine = self._require_engine()
        configured = float(engine.gradient_clipping() or 0.0)
        if configured != float(max_norm):
            raise AcceleratorConfigError(
                f"clip_grad_norm_(max_norm={max_norm}) under DeepSpeed: the engine clips inside its "
                f"step at gradient_clipping={configured}; set DeepSpeedPlugin(gradient_clipping="
                f"{max_norm}) or gradient_clipping in the config file (or --gradient_clipping)."
            )
        norm = engine.get_global_grad_norm()
        if norm is None:  # stage 0 keeps none; nan before the first step
            norm = self._unzero_norm
        return torch.as_tensor(float("nan") if norm is None else float(norm))

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
        """The engine's model and optimizer go through ``engine.save_checkpoint`` (every rank)."""
        if self.engine is None:
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
        return plain_models, plain_optimizers, [EngineCheckpoint(self.engine)]

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on the CPU, on every rank (ZeRO-3 shards gathered first)."""
        engine = self.engine
        module = self.unwrap(model) or model
        if engine is None or module is not engine.module:
            return {
                name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()
            }
        if engine.zero_optimization_partition_weights():
            deepspeed = import_deepspeed()
            parameters = list(module.parameters())
            with deepspeed.zero.GatheredParameters(parameters, modifier_rank=None):
                return {
                    name: tensor.detach().cpu().clone()
                    for name, tensor in module.state_dict().items()
                }
        return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}

    def _require_engine(self) -> Any:
        if self.engine is None:
            raise PreparationError(
                "No DeepSpeed engine yet: pass the model (and its optimizer) to accelerator.prepare first."
            )
        return self.engine


class EngineCheckpoint:
    """The engine's own checkpoint (model, optimizer shards, its scheduler) inside accel's folder.

    Written with ``engine.save_checkpoint`` by every rank into the checkpoint's ``deepspeed``
    subfolder; accel-ckpt lists the files and publishes the folder atomically.
    """

    name = "deepspeed"
    tag = "engine"

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def save(self, folder: Path) -> None:
        """Write this rank's part of the engine checkpoint into ``folder``."""
        self.engine.save_checkpoint(str(folder), tag=self.tag, save_latest=False)

    def load(self, folder: Path) -> None:
        """Load the engine checkpoint from ``folder`` (model, optimizer and scheduler states).

        Raises:
            IncompleteCheckpointError: ``folder`` holds no engine checkpoint.
        """
        if not (folder / self.tag).is_dir():
            raise IncompleteCheckpointError(
                f"{folder} holds no DeepSpeed engine checkpoint (no {self.tag!r} folder); was the "
                "state saved under DeepSpeed?"
            )
        path, _ = self.engine.load_checkpoint(
            str(folder), tag=self.tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise IncompleteCheckpointError(
                f"DeepSpeed could not load the engine checkpoint in {folder}."
            )


def _total_norm(parameters: Any) -> float:
    """The 2-norm of all gradients of ``parameters``."""
    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def _ensure_process_group(deepspeed: Any, state: PartialState) -> None:
    """Let deepspeed use accel's process group; a single process gets a one-rank group."""
    if not state.use_distributed:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    deepspeed.init_distributed(dist_backend=state.backend or "gloo", auto_mpi_discovery=False)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _selected_plugin(default: DeepSpeedPlugin) -> DeepSpeedPlugin:
    """The plugin selected on the ``AcceleratorState`` now (several plugins), else ``default``."""
    from accel.state import AcceleratorState

    selected = AcceleratorState._shared_state.get("deepspeed_plugin")
    return selected if isinstance(selected, DeepSpeedPlugin) else default
