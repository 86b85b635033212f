"""Fully sharded data parallel: FSDP2 (``fully_shard``, DTensor parameters) or the FSDP1 wrapper.

Each process keeps about 1/N of every parameter; FSDP gathers them for forward and backward and
reduce-scatters the gradients. Settings come from :class:`~accel.FullyShardedDataParallelPlugin`
or from the launcher's ``--fsdp_*`` flags / ``fsdp_config`` keys.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from accel.errors import AcceleratorConfigError
from accel.placement import ParameterMoves, switch_parameters
from accel.run_config import RunConfig
from accel.strategies.base import ModelStrategy
from accel.strategies.fsdp.meta_loading import (
    check_meta_ranks,
    detach_full_state,
    has_meta_tensors,
    load_full_state,
    materialize_fn,
    meta_ranks,
)
from accel.strategies.fsdp.plugin import (
    FSDPSettings,
    FullyShardedDataParallelPlugin,
    mixed_precision_dtypes,
)
from accel.torch_compat import (
    fsdp2_api,
    fsdp2_root_reshard_after_forward,
    require_torch_feature,
)
from accel_ckpt import ShardedState
from accel_state import DistributedType
from accel_state.group_keeper import GroupHolders
from accel_state.process_group import release_group_references
from accel_state.torch_compat import is_dtensor

_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """A parameter name without FSDP1, activation-checkpoint and compile wrapper prefixes."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def resolve_settings(config: RunConfig) -> FSDPSettings:
    """The FSDP settings: the run's plugin (as it is now), else the launcher's ``fsdp_config``.

    Raises:
        AcceleratorConfigError: The plugin is not a ``FullyShardedDataParallelPlugin``.
    """
    plugin = config.fsdp_plugin
    if plugin is None:
        plugin = FullyShardedDataParallelPlugin()
    if not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise AcceleratorConfigError(
            f"fsdp_plugin={plugin!r}: pass an accel.FullyShardedDataParallelPlugin."
        )
    return plugin.resolved(config.process.contract.fsdp_config)


class FSDPStrategy(ModelStrategy):
    """Shards trainable models with FSDP2 (default) or FSDP1 and checkpoints them shard by shard.

    A single process without a process group (``python script.py``) starts a one-process group
    (see ``PartialState.ensure_process_group``), so a script that asks for FSDP in code runs, and
    resumes its sharded checkpoints, on one process too.

    Raises:
        AcceleratorConfigError: torch.distributed is missing, or bad settings.
    """

    name = "FSDP"

    @property
    def phases_without_waiting(self) -> frozenset[str]:
        """Data and the optimizer step: FSDP gathers and scatters in forward and backward."""
        return frozenset({"data", "optimizer"})

    @property
    def shards_with_fsdp2(self) -> bool:
        """Whether this job shards with FSDP2 (``fully_shard``), not FSDP1."""
        return self.config.distributed_type is DistributedType.FSDP and self.fsdp.fsdp_version == 2

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        state = config.process
        if not dist.is_available():
            raise AcceleratorConfigError(
                "FSDP (fsdp_plugin / --use_fsdp / distributed_type: FSDP) needs torch.distributed, "
                "which this PyTorch build lacks: install a build with it, or drop the FSDP setting."
            )
        # One process without a group (a plain `python script.py`, e.g. resuming a sharded
        # checkpoint on one machine): FSDP runs on a one-process group started here.
        state.ensure_process_group("FSDP (fsdp_plugin / --use_fsdp / distributed_type: FSDP)")
        self.fsdp = resolve_settings(config)
        if self.fsdp.fsdp_version == 2:
            require_torch_feature("fsdp2", config.device.type)
        #: The DeviceMesh ``fully_shard`` shards over (``None``: every process). The N-D
        #: strategy (``accel.strategies.mesh.strategy``) sets its ``dp_shard_cp`` / HSDP mesh here.
        self.mesh: Any = None
        self._moves: ParameterMoves = {}
        self._roots: list[weakref.ref[torch.nn.Module]] = []

    # ------------------------------------------------------------------ wrapping
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Shard ``model`` (already on its device) unless it has nothing to train."""
        if self._is_sharded(model):
            return model
        if not any(parameter.requires_grad for parameter in model.parameters()):
            return model
        before = {clean_name(name): parameter for name, parameter in model.named_parameters()}
        on_meta = meta_ranks(model, self.state.device)
        check_meta_ranks(on_meta, self.fsdp.sync_module_states, self.fsdp.param_init_fn is not None)
        if self.fsdp.param_init_fn is not None:
            initialize_meta_modules(model, self.fsdp.param_init_fn)
        elif on_meta and self.fsdp.fsdp_version == 1:
            # FSDP1: storage for the meta modules on the device (FSDP1's own sync_module_states
            # refuses CPU tensors, so the broadcast below gives every rank rank 0's values).
            initialize_meta_modules(model, materialize_fn(model, self.state.device))
        full = None
        if self._loads_from_rank0(on_meta):
            full = detach_full_state(model, dist.get_rank())
        elif self.fsdp.sync_module_states:
            broadcast_from_rank0(model)
        layers = self._layers(model)
        if self.fsdp.activation_checkpointing:
            checkpoint_activations(model, layers, self.fsdp.activation_checkpointing_offload)
        if self.fsdp.fsdp_version == 2:
            wrapped = self._fully_shard(model, layers)
            if full is not None:
                load_full_state(wrapped, full, self.state.device, self.fsdp.cpu_offload)
        else:
            wrapped = self._fsdp1(model, layers)
        self._adopt(wrapped, before)
        return wrapped

    def _loads_from_rank0(self, on_meta: list[int]) -> bool:
        """Whether FSDP2 shards on ``meta`` and fills the shards from rank 0's full state dict.

        So with ``cpu_ram_efficient_loading`` (as Accelerate does) or when some rank's model is
        on ``meta``; starting from rank 0's weights needs ``sync_module_states``.
        """
        return (
            self.fsdp.fsdp_version == 2
            and self.fsdp.sync_module_states
            and self.fsdp.param_init_fn is None
            and (self.fsdp.cpu_ram_efficient_loading or bool(on_meta))
        )

    def places_model_itself(self, model: torch.nn.Module) -> bool:
        """A model with ``meta`` tensors, or any under FSDP2's ``cpu_ram_efficient_loading``.

        Such a model is sharded on ``meta`` and filled from rank 0 on the device (FSDP2), or
        its meta modules get storage on the device (FSDP1): moving it first would fail (meta has
        no values) or copy rank 0's full weights to the device for nothing.
        """
        if self._is_sharded(model) or not any(p.requires_grad for p in model.parameters()):
            return False  # left as it is by wrap: placed as any model
        if has_meta_tensors(model):
            return True
        return (
            self.fsdp.fsdp_version == 2
            and self.fsdp.cpu_ram_efficient_loading
            and self.fsdp.sync_module_states
            and self.fsdp.param_init_fn is None
        )

    def _adopt(self, wrapped: torch.nn.Module, before: Mapping[str, torch.nn.Parameter]) -> None:
        """Track a model this strategy wrapped: its parameters' moves, its root, its exit hook.

        Args:
            wrapped: The model as :meth:`wrap` returns it.
            before: Its parameters by clean name, taken before wrapping (the user's objects).
        """
        for name, parameter in wrapped.named_parameters():
            old = before.get(clean_name(name))
            if old is not None and old is not parameter:
                self._moves[id(old)] = (weakref.ref(old), parameter)
        self._roots.append(weakref.ref(wrapped))
        _SHARDED.add(wrapped)

    def _is_sharded(self, model: torch.nn.Module) -> bool:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return isinstance(model, (fsdp2_api("FSDPModule"), FSDP))

    def _layers(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Submodules that become their own FSDP units, innermost first."""
        policy = self.fsdp.wrap_policy
        if policy == "NO_WRAP":
            return []
        if policy == "CALLABLE" and self.fsdp.wrap_policy_fn is not None:
            return _policy_units(model, self.fsdp.wrap_policy_fn)
        if policy == "TRANSFORMER_BASED_WRAP":
            wanted = set(self.fsdp.layer_class_names)
            present = {type(module).__name__ for module in model.modules()}
            missing = sorted(wanted - present)
            if missing:
                raise AcceleratorConfigError(
                    f"fsdp_transformer_layer_cls_to_wrap names {missing}, not found in "
                    f"{type(model).__name__}; its module classes are {sorted(present)}. "
                    "Set transformer_cls_names_to_wrap to the model's layer class names."
                )
            return [
                module
                for module in _post_order(model)
                if module is not model and type(module).__name__ in wanted
            ]
        return _size_based_units(model, self.fsdp.min_num_params)

    def _mixed_precision(self) -> dict[str, torch.dtype | None]:
        return mixed_precision_dtypes(
            self.fsdp.mixed_precision_policy, self.config.mixed_precision.value
        )

    def _fully_shard(
        self, model: torch.nn.Module, layers: list[torch.nn.Module]
    ) -> torch.nn.Module:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        dtypes = self._mixed_precision()
        mp_policy = MixedPrecisionPolicy(
            param_dtype=dtypes["param_dtype"], reduce_dtype=dtypes["reduce_dtype"]
        )
        pin = self.state.device.type == "cuda"
        offload = CPUOffloadPolicy(pin_memory=pin) if self.fsdp.cpu_offload else OffloadPolicy()
        options: dict[str, Any] = {
            "reshard_after_forward": self.fsdp.reshard_after_forward,
            "mp_policy": mp_policy,
            "offload_policy": offload,
        }
        if self.mesh is not None:
            options["mesh"] = self.mesh
        if self.fsdp.ignored_modules is not None:
            from accel.strategies.fsdp.common import get_parameters_from_modules

            options["ignored_params"] = get_parameters_from_modules(
                self.fsdp.ignored_modules, model, self.state.device
            )
        for layer in layers:
            fully_shard(layer, **options)
        if self.fsdp.reshard_after_forward:
            # torch's default for the root: keep its parameters gathered after forward, since
            # backward starts by needing them again (an explicit True costs one more all-gather
            # per step). The layer units above still reshard.
            options["reshard_after_forward"] = fsdp2_root_reshard_after_forward()
        fully_shard(model, **options)
        return model

    def _fsdp1(self, model: torch.nn.Module, layers: list[torch.nn.Module]) -> torch.nn.Module:
        from torch.distributed.fsdp import (
            BackwardPrefetch,
            CPUOffload,
            MixedPrecision,
            ShardingStrategy,
        )
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        dtypes = self._mixed_precision()
        mixed = None if dtypes["param_dtype"] is None else MixedPrecision(**dtypes)  # type: ignore[arg-type]
        device = self.state.device
        prefetch = self.fsdp.backward_prefetch
        wrapped = FSDP(
            model,
            sharding_strategy=ShardingStrategy[self.fsdp.sharding_strategy],
            cpu_offload=CPUOffload(offload_params=self.fsdp.cpu_offload),
            auto_wrap_policy=_IdentityWrapPolicy(layers) if layers else None,
            backward_prefetch=None if prefetch == "NO_PREFETCH" else BackwardPrefetch[prefetch],
            mixed_precision=mixed,
            forward_prefetch=self.fsdp.forward_prefetch,
            limit_all_gathers=self.fsdp.limit_all_gathers,
            use_orig_params=self.fsdp.use_orig_params,
            ignored_modules=self._ignored_modules(model),
            device_id=device,
            param_init_fn=self.fsdp.param_init_fn,
        )
        return wrapped

    def _ignored_modules(self, model: torch.nn.Module) -> list[torch.nn.Module] | None:
        """FSDP1's ``ignored_modules``: the plugin's modules, or those its regex names."""
        if self.fsdp.ignored_modules is None:
            return None
        from accel.strategies.fsdp.common import select_modules

        return select_modules(self.fsdp.ignored_modules, model, self.state.device)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The module inside an FSDP1 wrapper; an FSDP2 model is its own module, resharded."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if isinstance(model, FSDP):
            return model.module
        self.settle(model)
        return None

    def settle(self, model: torch.nn.Module) -> None:
        """Reshard every FSDP2 unit of ``model`` that a forward pass left gathered.

        The root keeps its gathered parameters after forward (torch's default, one all-gather
        per step less, since backward needs them first); after a forward with no backward (an
        evaluation pass) they stay gathered, and ``model.parameters()`` then names gathered
        stand-ins instead of the sharded ``DTensor`` parameters the optimizer steps. Resharding
        frees the gathered memory locally (no collective); the next forward gathers again.
        FSDP1 reshards inside its own state-dict and clipping calls: nothing to do.
        """
        fsdp2_module = fsdp2_api("FSDPModule")
        for module in model.modules():
            if isinstance(module, fsdp2_module):
                module.reshard()

    def _live_roots(self) -> list[torch.nn.Module]:
        return [model for root in self._roots if (model := root()) is not None]

    def _resting_moves(self, parameters: Sequence[torch.Tensor]) -> ParameterMoves:
        """Settle every prepared model; map gathered stand-ins among ``parameters`` to shards.

        Parameters are matched by name inside their model, read before and after resharding.
        """
        wanted = {id(parameter) for parameter in parameters}
        moves: ParameterMoves = {}
        for model in self._live_roots():
            gathered = {
                name: parameter
                for name, parameter in model.named_parameters()
                if id(parameter) in wanted
            }
            self.settle(model)
            if not gathered:
                continue
            resting = dict(model.named_parameters())
            for name, parameter in gathered.items():
                shard = resting.get(name)
                if shard is not None and shard is not parameter:
                    moves[id(parameter)] = (weakref.ref(parameter), shard)
        return moves

    def resolve_parameters(self, parameters: list[torch.Tensor]) -> list[torch.Tensor]:
        """``parameters`` with FSDP2's gathered stand-ins replaced by the sharded parameters."""
        if self.fsdp.fsdp_version != 2:
            return parameters
        if all(is_dtensor(parameter) for parameter in parameters):
            return parameters  # already the shards (the usual case, right after backward)
        moves = self._resting_moves(parameters)
        return [
            moves[id(parameter)][1] if id(parameter) in moves else parameter
            for parameter in parameters
        ]

    # ------------------------------------------------------------------ optimizers
    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Point an optimizer built before ``prepare`` at the sharded parameters.

        Raises:
            AcceleratorConfigError: The optimizer holds parameters of no prepared FSDP model.
        """
        switch_parameters(optimizer, self._moves)
        # An optimizer built on model.parameters() after an evaluation forward holds gathered
        # stand-ins of the root's parameters: point it at the shards (this settles every model).
        switch_parameters(
            optimizer,
            self._resting_moves(
                [parameter for group in optimizer.param_groups for parameter in group["params"]]
            ),
        )
        sharded = {
            id(parameter) for model in self._live_roots() for parameter in model.parameters()
        }
        stray = [
            tuple(parameter.shape)
            for group in optimizer.param_groups
            for parameter in group["params"]
            if id(parameter) not in sharded
        ]
        if stray:
            raise AcceleratorConfigError(
                f"The optimizer {type(optimizer).__name__} holds {len(stray)} parameter(s) "
                f"(shapes {stray[:3]}...) that belong to no model prepared with FSDP. Build the "
                "optimizer on model.parameters() and pass the model to prepare() together with it "
                "(or before it)."
            )

    # ------------------------------------------------------------------ training step
    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient reduce-scatter for this micro-step (gradients accumulate unsharded)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if isinstance(model, FSDP):
            return model.no_sync()
        if isinstance(model, fsdp2_api("FSDPModule")):
            return _fsdp2_no_sync(model)
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the global norm over every shard; returns that norm (a plain tensor)."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        wanted = {id(parameter) for parameter in parameters}
        for model in self._live_roots():
            if isinstance(model, FSDP) and wanted <= {id(p) for p in model.parameters()}:
                return model.clip_grad_norm_(max_norm, norm_type)
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        full = getattr(norm, "full_tensor", None)
        return full() if full is not None else norm

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_split(
        self, models: Sequence[torch.nn.Module], optimizers: Sequence[Any]
    ) -> tuple[list[torch.nn.Module], list[Any], list[ShardedState]]:
        """FSDP models and their optimizers go into sharded states; the rest stays plain."""
        from accel.strategies.fsdp.checkpoint import FSDPModelState, model_optimizers

        plain_models: list[torch.nn.Module] = []
        states: list[ShardedState] = []
        claimed: set[int] = set()
        # The plugin's type now: set_state_dict_type may have changed it since prepare.
        full = resolve_settings(self.config).state_dict_type == "FULL_STATE_DICT"
        for model in models:
            if not self._is_sharded(model):
                plain_models.append(model)
                continue
            # Read the shards, whatever the last forward left gathered: the optimizers hold them.
            self.settle(model)
            mine = model_optimizers(model, optimizers, claimed)
            states.append(
                FSDPModelState(
                    name=f"fsdp_model_{len(states)}",
                    model=model,
                    optimizers=mine,
                    full=full,
                )
            )
        plain_optimizers = [opt for opt in optimizers if id(opt) not in claimed]
        return plain_models, plain_optimizers, states

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The gathered, unsharded weights on the CPU (complete on the main process)."""
        if not self._is_sharded(model):
            return super().full_state_dict(model)
        self.settle(model)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from accel.strategies.fsdp.checkpoint import off_cpu

        options = StateDictOptions(full_state_dict=True, cpu_offload=off_cpu(model))
        state = get_model_state_dict(model, options=options)
        return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}


# Every model this process sharded: everything reachable from it (FSDP units, DTensor parameters
# and their meshes, for FSDP, HSDP and tensor-parallel models alike) holds groups where no public
# API releases them, so destroyed groups are taken from all of it before they are freed.
_SHARDED = GroupHolders(lambda models: release_group_references(*models))


@contextlib.contextmanager
def _fsdp2_no_sync(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _post_order(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _policy_units(model: torch.nn.Module, policy: Callable[..., bool]) -> list[torch.nn.Module]:
    """Submodules a torch auto-wrap policy function picks, innermost first.

    Asked as torch's FSDP1 wrapper asks it: ``policy(module=..., recurse=False,
    nonwrapped_numel=...)``, with the parameters not already in a chosen unit below.
    """
    units: list[torch.nn.Module] = []
    covered: set[int] = set()
    for module in _post_order(model):
        if module is model:
            break
        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            continue  # containers without forward cannot be units
        free = [p for p in module.parameters() if id(p) not in covered]
        numel = sum(p.numel() for p in free)
        if free and policy(module=module, recurse=False, nonwrapped_numel=numel):
            units.append(module)
            covered.update(id(p) for p in free)
    return units


def _size_based_units(model: torch.nn.Module, min_num_params: int) -> list[torch.nn.Module]:
    """Submodules holding ``min_num_params`` parameters not already in a smaller unit."""

    def large_enough(*, module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return nonwrapped_numel >= min_num_params

    return _policy_units(model, large_enough)


class _IdentityWrapPolicy:
    """FSDP1 auto-wrap policy that wraps exactly the given module objects."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        self._ids = {id(layer) for layer in layers}

    def __call__(self, module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return True if recurse else id(module) in self._ids


def broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Make every rank start from rank 0's parameters and buffers (as DDP does)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def initialize_meta_modules(
    model: torch.nn.Module, param_init_fn: Callable[[torch.nn.Module], None]
) -> None:
    """Call ``param_init_fn`` on each sub-module with meta-device tensors of its own, innermost first."""
    for module in _post_order(model):
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if any(tensor.is_meta for tensor in own):
            param_init_fn(module)


def checkpoint_activations(
    model: torch.nn.Module, layers: list[torch.nn.Module], offload: bool = False
) -> None:
    """Recompute the activations of ``layers`` in backward instead of storing them.

    With ``offload`` each checkpointed layer's saved input waits on the CPU until backward
    (torch's ``offload_wrapper`` around the checkpoint wrapper).

    Raises:
        AcceleratorConfigError: No layers are wrapped, so nothing would be checkpointed.
    """
    if not layers:
        raise AcceleratorConfigError(
            "fsdp_activation_checkpointing=true needs wrapped layers: set "
            "fsdp_auto_wrap_policy (TRANSFORMER_BASED_WRAP with fsdp_transformer_layer_cls_to_wrap, "
            "or SIZE_BASED_WRAP)."
        )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
        offload_wrapper,
    )

    def wrap(module: torch.nn.Module) -> torch.nn.Module:
        wrapped = checkpoint_wrapper(module)
        return offload_wrapper(wrapped) if offload else wrapped

    ids = {id(layer) for layer in layers}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=wrap,
        check_fn=lambda module: id(module) in ids,
    )
