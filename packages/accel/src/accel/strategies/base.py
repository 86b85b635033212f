"""The interface every model-wrapping strategy implements, and the single-process default."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from accel.kwargs_handlers import GradScalerKwargs, TorchDynamoPlugin
from accel.precision import Precision, make_precision
from accel.run_config import RunConfig
from accel_ckpt import ShardedState
from accel_state import PartialState

#: The phases of a step in which a strategy that only sums gradients never waits for others.
PHASES_WITHOUT_WAITING = frozenset({"data", "forward", "optimizer"})


class ModelStrategy:
    """How models are wrapped, synchronised and stepped for one distributed mode.

    The base class is the single-process behaviour: nothing wrapped, nothing synchronised.
    """

    name = "single process"
    #: The strategy's engine owns the gradients (DeepSpeed): it divides the loss by the
    #: accumulation steps, scales and unscales, and clips at its own setting, so the Accelerator
    #: leaves all of that to :meth:`backward` and the clipping hooks.
    engine_owns_gradients = False

    def __init__(self, config: RunConfig) -> None:
        #: The run configuration this strategy was built from (resolved once, handed down).
        self.config = config
        #: The process's facts (rank, device, process group).
        self.state: PartialState = config.process

    def make_precision(self, scaler_kwargs: GradScalerKwargs | None = None) -> Precision:
        """The precision object this strategy trains with, for the run's mode (asked once).

        fp8 comes from the run's fp8 backend and recipe (:attr:`RunConfig.fp8`), with this
        strategy's facts (:attr:`shards_with_fsdp2`); the other modes are autocast and, for fp16,
        loss scaling.

        Args:
            scaler_kwargs: The ``GradScalerKwargs`` handler for fp16, if any.

        Raises:
            UnsupportedFeatureError: The mode cannot run on this device or with this strategy.
        """
        fp8 = self.config.fp8
        if fp8 is not None and fp8.enabled:
            from accel.fp8.setup import make_fp8_precision

            return make_fp8_precision(
                fp8, self.state.device, self.config.distributed_type, fsdp2=self.shards_with_fsdp2
            )
        return make_precision(self.config.mixed_precision, self.state.device, scaler_kwargs)

    @property
    def shards_with_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (``fully_shard``)."""
        return False

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap a model that is already on its device."""
        return model

    def places_model_itself(self, model: torch.nn.Module) -> bool:
        """Whether :meth:`wrap` puts ``model`` on the device itself (``prepare`` then leaves it).

        FSDP says so for a model on the ``meta`` device (``cpu_ram_efficient_loading``): it has no
        values to move; sharding gives it storage and rank 0's weights.
        """
        return False

    def track_unwrapped(self, model: torch.nn.Module) -> None:
        """See a model prepared with ``evaluation_mode=True`` (left as it is): nothing to do here."""

    def compile(self, model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
        """``torch.compile`` a wrapped model as ``plugin`` says (a strategy may compile earlier)."""
        from accel.compilation import compile_model

        return compile_model(model, plugin)

    def prepare_together(self, prepared: list[Any], dataloaders: Sequence[Any]) -> list[Any]:
        """See every object of one ``prepare`` call once each was prepared on its own.

        Args:
            prepared: The call's objects, prepared, in the caller's order.
            dataloaders: Every dataloader the Accelerator has prepared so far.

        Returns:
            The objects in the same order; the Accelerator records any that were replaced.
        """
        return prepared

    def free_memory(self) -> None:
        """Forget what the strategy built at ``prepare`` (``Accelerator.free_memory``)."""

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """Return the module inside this strategy's wrapper, or ``None`` if ``model`` is not one."""
        return None

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context manager in which backward passes do not synchronise gradients."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Run the backward pass of an already scaled loss."""
        loss.backward(**kwargs)

    @property
    def phases_without_waiting(self) -> frozenset[str]:
        """The phases of a step in which this strategy never waits for other processes.

        The slow-rank report compares the processes' times only in these (``"data"``,
        ``"forward"``, ``"optimizer"``), and in backward through :meth:`gradients_ready_at`:
        time spent waiting for a slow peer would make a fast process look slow.
        """
        return PHASES_WITHOUT_WAITING

    def gradients_ready_at(self) -> float | None:
        """When (``time.perf_counter()``) this process's last gradient bucket was ready to sum.

        The slow-rank report's backward clock: from the start of backward to this moment is
        the rank's own work, before it waits for the others. None (the default) where the
        strategy cannot tell; the report then times the whole backward pass.
        """
        return None

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook before each real optimizer step (XLA reduces gradients here)."""

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook after each real optimizer step (XLA cuts and runs the traced graph here)."""

    def before_clipping(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook before gradients are clipped: they must be complete (XLA reduces them here)."""

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook when an optimizer is prepared, after the models (FSDP rebinds its parameters)."""

    def settle(self, model: torch.nn.Module) -> None:
        """Bring a prepared model to its resting layout before its parameters or state are read.

        A sharding strategy may leave parameters gathered after a forward pass that had no
        backward (FSDP2's root after an evaluation pass); read then, the model would show the
        gathered copies instead of the shards the optimizer steps. Not a collective: safe to call
        on one process. Default: nothing to do.
        """

    def resolve_parameters(self, parameters: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors that hold the gradients of ``parameters``, as listed by the caller.

        Where a strategy swaps parameter objects (FSDP2's gathered stand-ins), a list taken from
        ``model.parameters()`` at the wrong moment names the stand-ins; clipping must act on the
        real ones. Default: ``parameters`` themselves.
        """
        return parameters

    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip ``parameters``' gradients to ``max_norm``; returns the total norm before clipping.

        The one hook for clipping by norm: sharding strategies take the norm over every shard,
        an engine that owns the gradients clips its own way.
        """
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: list[torch.Tensor], clip_value: float) -> None:
        """Clamp ``parameters``' gradients to ``[-clip_value, clip_value]`` (the one value hook)."""
        with_gradients = [tensor for tensor in parameters if tensor.grad is not None]
        if with_gradients:  # torch 2.13's foreach clamp raises on an empty list
            torch.nn.utils.clip_grad_value_(with_gradients, clip_value)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The complete, unsharded weights of a prepared model (call on every process).

        What ``Accelerator.get_state_dict`` and ``save_model`` write. Sharding strategies gather
        here (a collective); the default takes the state dict of the unwrapped module.

        Args:
            model: The model as ``prepare`` returned it, or the module inside it.
        """
        from accel.modeling import unwrap_model

        plain = unwrap_model(model, unwrappers=[self.unwrap], keep_torch_compile=False)
        return state_dict_with_offloaded_weights(plain)

    def checkpoint_split(
        self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any]
    ) -> tuple[list[torch.nn.Module], list[Any], list[ShardedState]]:
        """Split prepared models and optimizers into plain ones and sharded checkpoint states.

        ``save_state``/``load_state`` store the plain ones as whole files (main process) and let
        each :class:`~accel_ckpt.ShardedState` write every process's part. The default: all plain.
        """
        return list(models), list(optimizers), []

    def checkpoint_metadata(self, models: Sequence[torch.nn.Module]) -> dict[str, Any]:
        """JSON data of this strategy that ``save_state`` keeps in the checkpoint's manifest.

        Called on every process while saving; :meth:`checkpoint_metadata_loaded` gets it back.
        The default: nothing.
        """
        return {}

    def checkpoint_metadata_loaded(
        self, models: Sequence[torch.nn.Module], metadata: dict[str, Any]
    ) -> None:
        """Take back what :meth:`checkpoint_metadata` saved (every process, after loading)."""


def state_dict_with_offloaded_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()``, with the weights of offloaded submodules loaded into it.

    A module dispatched with CPU or disk offload keeps meta tensors in place of the weights
    its hook brings in at each forward; they are loaded here one module at a time (on the CPU),
    so that ``save_model`` writes real values, as Accelerate's does.
    """
    from accel_ckpt.big_modeling.hooks import offloading_hook
    from accel_ckpt.big_modeling.model_helpers import align_module_device

    state = module.state_dict()
    for name, sub in module.named_modules():
        if offloading_hook(sub) is None:
            continue
        prefix = f"{name}." if name else ""
        with align_module_device(sub, torch.device("cpu")):
            own = [*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)]
            for key, tensor in own:
                if f"{prefix}{key}" in state:
                    state[f"{prefix}{key}"] = tensor.detach().to("cpu", copy=True)
    return state
