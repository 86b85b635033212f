"""``FullyShardedDataParallelPlugin``: FSDP settings under Accelerate's field names.

Every field left at ``None`` is taken from the launcher (``accel launch --use_fsdp --fsdp_*`` or the
``fsdp_config`` section of a config file, carried by the launch contract), then from the defaults.

Example:
    >>> from accel import Accelerator, FullyShardedDataParallelPlugin
    >>> plugin = FullyShardedDataParallelPlugin(  # doctest: +SKIP
    ...     auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    ... )
    >>> accelerator = Accelerator(fsdp_plugin=plugin)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from accel.errors import AcceleratorConfigError

SHARDING_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
)
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT")
#: State-dict types accel can write into a checkpoint.
WRITABLE_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")

#: ``fsdp_config`` key (launcher / YAML) -> plugin field.
LAUNCHER_KEYS = {
    "fsdp_version": "fsdp_version",
    "fsdp_sharding_strategy": "sharding_strategy",
    "fsdp_reshard_after_forward": "reshard_after_forward",
    "fsdp_offload_params": "cpu_offload",
    "fsdp_auto_wrap_policy": "auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
    "fsdp_min_num_params": "min_num_params",
    "fsdp_backward_prefetch": "backward_prefetch",
    "fsdp_backward_prefetch_policy": "backward_prefetch",
    "fsdp_forward_prefetch": "forward_prefetch",
    "fsdp_state_dict_type": "state_dict_type",
    "fsdp_use_orig_params": "use_orig_params",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    "fsdp_sync_module_states": "sync_module_states",
    "fsdp_activation_checkpointing": "activation_checkpointing",
    "fsdp_activation_checkpointing_offload": "activation_checkpointing_offload",
}

_DEFAULTS: dict[str, Any] = {
    "fsdp_version": 2,
    "sharding_strategy": "FULL_SHARD",
    "backward_prefetch": "BACKWARD_PRE",
    "cpu_offload": False,
    "state_dict_type": "SHARDED_STATE_DICT",
    "use_orig_params": True,
    "sync_module_states": True,
    "forward_prefetch": False,
    "activation_checkpointing": False,
    "activation_checkpointing_offload": False,
    "cpu_ram_efficient_loading": False,
    "limit_all_gathers": True,
    "min_num_params": 100_000_000,
}


@dataclasses.dataclass
class FullyShardedDataParallelPlugin:
    """FSDP settings (Accelerate's field names); ``None`` means "launcher's value, else default".

    Args:
        fsdp_version: 2 (``fully_shard``, DTensor parameters; default) or 1 (the FSDP wrapper).
            Left unset (here and in the launcher) with ``sharding_strategy`` given as torch's
            FSDP1 ``ShardingStrategy`` enum, it is 1: that enum configures the FSDP1 wrapper.
        sharding_strategy: ``FULL_SHARD``, ``SHARD_GRAD_OP``, ``NO_SHARD`` (FSDP1), ``HYBRID_SHARD*``
            (FSDP1). Under FSDP2 ``FULL_SHARD``/``SHARD_GRAD_OP`` set ``reshard_after_forward``.
        reshard_after_forward: FSDP2: free the gathered parameters after forward.
        backward_prefetch: FSDP1 prefetch policy (FSDP2 prefetches on its own).
        mixed_precision_policy: A dict of ``param_dtype``/``reduce_dtype``/``buffer_dtype``, or
            torch's ``MixedPrecision``/``MixedPrecisionPolicy``; default: from ``mixed_precision``.
        auto_wrap_policy: ``transformer_based_wrap``, ``size_based_wrap``, ``no_wrap`` (any case).
        transformer_cls_names_to_wrap: Layer class names that become FSDP units.
        min_num_params: Parameter count from which ``size_based_wrap`` makes a unit.
        cpu_offload: Keep parameters (and gradients, optimizer states) on the CPU.
        state_dict_type: ``SHARDED_STATE_DICT`` (each rank writes its shards; reshards on load)
            or ``FULL_STATE_DICT`` (gathered on rank 0) for ``save_state``.
        use_orig_params: FSDP1: expose the original parameters (needed for optimizers built
            before ``prepare``).
        sync_module_states: Start from rank 0's weights.
        forward_prefetch: FSDP1: prefetch the next all-gather in forward.
        activation_checkpointing: Recompute the activations of the wrapped layers in backward.
        cpu_ram_efficient_loading: Accepted for compatibility (weights are synchronised from
            rank 0 either way).
        limit_all_gathers: FSDP1 rate limiter.
        ignored_modules: Modules FSDP leaves alone.
        state_dict_config: torch's ``FullStateDictConfig`` or ``ShardedStateDictConfig``: with
            ``state_dict_type`` unset, it picks ``FULL_STATE_DICT`` or ``SHARDED_STATE_DICT``
            (a different ``state_dict_type`` is an error).
        optim_state_dict_config: torch's ``FullOptimStateDictConfig`` or
            ``ShardedOptimStateDictConfig``, read the same way (it must agree).
        param_init_fn: Called on each sub-module that still has meta-device tensors, to give
            them storage and values: FSDP1's ``param_init_fn``; under FSDP2 applied before
            ``fully_shard``.
        activation_checkpointing_offload: With ``activation_checkpointing`` under FSDP2, also
            keep each checkpointed layer's saved input on the CPU until backward.
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: bool | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    transformer_cls_names_to_wrap: Sequence[str] | str | None = None
    min_num_params: int | None = None
    cpu_offload: Any = None
    state_dict_type: Any = None
    use_orig_params: bool | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    limit_all_gathers: bool | None = None
    ignored_modules: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    activation_checkpointing_offload: bool | None = None

    def resolved(self, launcher: Mapping[str, Any] | None = None) -> FSDPSettings:
        """Combine with the launcher's ``fsdp_config`` and defaults, and validate.

        Raises:
            AcceleratorConfigError: A value is unknown or a combination has no meaning.
        """
        values: dict[str, Any] = dict(_DEFAULTS)
        for key, value in (launcher or {}).items():
            target = LAUNCHER_KEYS.get(key)
            if target is not None and value is not None:
                values[target] = value
        for name in (item.name for item in dataclasses.fields(self)):
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        # torch's ShardingStrategy configures the FSDP1 wrapper only (FSDP2 has no such setting):
        # code written against it, as for Accelerate's FSDP1 default, gets FSDP1.
        version_unset = self.fsdp_version is None and "fsdp_version" not in (launcher or {})
        if version_unset and _is_fsdp1_sharding_strategy(self.sharding_strategy):
            values["fsdp_version"] = 1
        type_unset = self.state_dict_type is None and "fsdp_state_dict_type" not in (launcher or {})
        implied = _state_dict_type_of_configs(self.state_dict_config, self.optim_state_dict_config)
        if implied is not None:
            if type_unset:
                values["state_dict_type"] = implied
            elif _choice("state_dict_type", values["state_dict_type"], STATE_DICT_TYPES) != implied:
                raise AcceleratorConfigError(
                    f"state_dict_type={values['state_dict_type']!r} but state_dict_config / "
                    f"optim_state_dict_config are {implied} configs; make them agree (or leave "
                    "state_dict_type unset)."
                )
        strategy_given = self.sharding_strategy is not None or (
            (launcher or {}).get("fsdp_sharding_strategy") is not None
        )
        return _validate(values, strategy_given=strategy_given)

    def fill_unset(
        self, launcher: Mapping[str, Any] | None = None
    ) -> FullyShardedDataParallelPlugin:
        """Write the resolved settings into the fields left at ``None`` (as Accelerate's plugin reads).

        Accelerate's plugin holds its final values once made (``fsdp_version``,
        ``state_dict_type``...); code such as transformers' Trainer reads them there. The
        ``AcceleratorState`` calls this with the launcher's ``fsdp_config`` when it adopts a plugin
        (one it makes from the launcher too). Fields already set are kept, so
        :meth:`resolved` gives the same settings afterwards.

        Returns:
            The plugin itself.

        Raises:
            AcceleratorConfigError: The settings are invalid (see :meth:`resolved`).
        """
        settings = self.resolved(launcher)
        launcher = launcher or {}
        filled: dict[str, Any] = {
            "fsdp_version": settings.fsdp_version,
            "state_dict_type": settings.state_dict_type,
            "backward_prefetch": settings.backward_prefetch,
            "min_num_params": settings.min_num_params,
            "cpu_offload": settings.cpu_offload,
            "use_orig_params": settings.use_orig_params,
            "sync_module_states": settings.sync_module_states,
            "forward_prefetch": settings.forward_prefetch,
            "activation_checkpointing": settings.activation_checkpointing,
            "activation_checkpointing_offload": settings.activation_checkpointing_offload,
            "limit_all_gathers": settings.limit_all_gathers,
            "cpu_ram_efficient_loading": _flag(
                "cpu_ram_efficient_loading",
                launcher.get(
                    "fsdp_cpu_ram_efficient_loading", _DEFAULTS["cpu_ram_efficient_loading"]
                ),
            ),
        }
        if settings.wrap_policy != "CALLABLE":
            filled["auto_wrap_policy"] = settings.wrap_policy.lower()
        if settings.layer_class_names:
            filled["transformer_cls_names_to_wrap"] = list(settings.layer_class_names)
        if settings.fsdp_version == 2:
            filled["reshard_after_forward"] = settings.reshard_after_forward
        else:
            filled["sharding_strategy"] = settings.sharding_strategy
        for name, value in filled.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        return self

    @classmethod
    def from_launcher(cls, launcher: Mapping[str, Any] | None) -> FullyShardedDataParallelPlugin:
        """The plugin the launcher's ``fsdp_config`` describes (``accel launch --use_fsdp``...).

        Raises:
            AcceleratorConfigError: The launcher's settings are invalid.
        """
        return cls().fill_unset(launcher)

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Choose the state-dict type for the next saves (Accelerate's name).

        The usual use: train with ``SHARDED_STATE_DICT`` checkpoints, then switch to
        ``FULL_STATE_DICT`` before a final ``save_model`` / ``get_state_dict``. ``state_dict_config``
        and ``optim_state_dict_config`` objects of the other type are dropped.

        Args:
            state_dict_type: ``FULL_STATE_DICT`` or ``SHARDED_STATE_DICT`` (a name, or torch's
                ``StateDictType``); ``None`` keeps the current one.

        Raises:
            AcceleratorConfigError: The type is unknown or cannot be written by accel.
        """
        if state_dict_type is None:
            return
        chosen = _choice("state_dict_type", state_dict_type, STATE_DICT_TYPES)
        if chosen not in WRITABLE_STATE_DICT_TYPES:
            raise AcceleratorConfigError(
                f"set_state_dict_type({state_dict_type!r}): accel writes FULL_STATE_DICT or "
                "SHARDED_STATE_DICT only; pass one of those."
            )
        self.state_dict_type = chosen
        for name in ("state_dict_config", "optim_state_dict_config"):
            config = getattr(self, name)
            if config is not None and _CONFIG_TYPES.get(type(config).__name__) != chosen:
                setattr(self, name, None)

    def set_mixed_precision(
        self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False
    ) -> None:
        """Set ``mixed_precision_policy`` from a precision name or dtype (Accelerate's method).

        Without ``override`` an existing policy is kept (a dict of dtypes becomes torch's policy
        object). The policy computes and reduces in the given dtype, as Accelerate's does (without
        a policy, accel reduces in float32).

        Args:
            mixed_precision: ``"bf16"``, ``"fp16"``, ``"fp8"`` (bf16 outside fp8 layers),
                ``"fp32"``, or one of those torch dtypes.
            buffer_autocast: FSDP1: keep buffers in float32.
            override: Replace an existing policy.

        Raises:
            AcceleratorConfigError: The precision is not one of those.
        """
        dtypes = {
            "fp8": torch.bfloat16,
            "fp16": torch.float16,
            "bf16": torch.bfloat16,
            "fp32": torch.float32,
        }
        dtype = dtypes.get(mixed_precision) if isinstance(mixed_precision, str) else mixed_precision
        if dtype not in dtypes.values():
            raise AcceleratorConfigError(
                f"set_mixed_precision({mixed_precision!r}): pass one of {sorted(dtypes)} or "
                "torch.bfloat16 / torch.float16 / torch.float32."
            )
        if override or self.mixed_precision_policy is None:
            policy: dict[str, Any] = {"param_dtype": dtype, "reduce_dtype": dtype}
            if self.fsdp_version == 1:
                policy["buffer_dtype"] = torch.float32 if buffer_autocast else dtype
            else:
                policy["output_dtype"] = dtype
            self.mixed_precision_policy = _torch_policy(self.fsdp_version, policy)
        elif isinstance(self.mixed_precision_policy, Mapping):
            mixed_precision_dtypes(self.mixed_precision_policy, "no")  # validates the keys
            self.mixed_precision_policy = _torch_policy(
                self.fsdp_version,
                {key: _dtype(value) for key, value in self.mixed_precision_policy.items()},
            )

    def validate_mixed_precision_policy(self) -> None:
        """Check ``mixed_precision_policy`` (a dict of dtypes or torch's policy object).

        Raises:
            AcceleratorConfigError: It is neither.
        """
        if self.mixed_precision_policy is not None:
            mixed_precision_dtypes(self.mixed_precision_policy, "no")

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Check the wrap policy against ``model`` (Accelerate's name; the policy is applied at prepare).

        Under ``transformer_based_wrap`` with no ``transformer_cls_names_to_wrap``, the model's
        ``_no_split_modules`` (what transformers models declare) become the layer classes.

        Raises:
            AcceleratorConfigError: A layer class to wrap does not occur in ``model``.
        """
        if self.auto_wrap_policy is None or callable(self.auto_wrap_policy):
            return
        if _name(self.auto_wrap_policy) != "TRANSFORMER_BASED_WRAP":
            return
        if self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = list(getattr(model, "_no_split_modules", ()) or ())
        present = {type(module).__name__ for module in model.modules()}
        missing = [
            name for name in _class_names(self.transformer_cls_names_to_wrap) if name not in present
        ]
        if missing:
            raise AcceleratorConfigError(
                f"transformer_cls_names_to_wrap names {missing}, which {type(model).__name__} "
                f"does not contain; its module classes are {sorted(present)}."
            )


@dataclasses.dataclass(frozen=True)
class FSDPSettings:
    """Validated FSDP settings the strategy works from (names upper-cased, lists split)."""

    fsdp_version: int
    sharding_strategy: str
    reshard_after_forward: bool
    backward_prefetch: str
    mixed_precision_policy: Any
    wrap_policy: str
    layer_class_names: tuple[str, ...]
    min_num_params: int
    cpu_offload: bool
    state_dict_type: str
    use_orig_params: bool
    sync_module_states: bool
    forward_prefetch: bool
    activation_checkpointing: bool
    limit_all_gathers: bool
    ignored_modules: Any
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    activation_checkpointing_offload: bool = False
    #: With ``wrap_policy == "CALLABLE"``: torch's auto-wrap policy function (for example what
    #: PEFT's ``fsdp_auto_wrap_policy`` returns), asked about each sub-module.
    wrap_policy_fn: Callable[..., bool] | None = None


def _is_fsdp1_sharding_strategy(value: Any) -> bool:
    """Whether ``value`` is a member of torch's FSDP1 ``ShardingStrategy`` enum."""
    from torch.distributed.fsdp import ShardingStrategy

    return isinstance(value, ShardingStrategy)


def _name(value: Any) -> str:
    """An enum member or a string as an upper-case name (``ShardingStrategy.FULL_SHARD`` too)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return str(getattr(value, "name", value)).upper()


def _choice(field: str, value: Any, choices: Sequence[str]) -> str:
    name = _name(value)
    if name.isdigit() and field == "sharding_strategy" and 1 <= int(name) <= 5:
        return SHARDING_STRATEGIES[int(name) - 1]  # Accelerate's old 1-based numbers
    if name not in choices:
        raise AcceleratorConfigError(
            f"FullyShardedDataParallelPlugin({field}={value!r}) is not known; "
            f"choose one of {', '.join(choices)}."
        )
    return name


def _flag(field: str, value: Any) -> bool:
    """A boolean setting; the strings ``true``/``false``/``1``/``0`` (environment values) too."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise AcceleratorConfigError(f"{field}={value!r}: use true or false.")
    return bool(value)


def _class_names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(item).strip() for item in items if str(item).strip())


def _strategy_name(value: Any) -> str | None:
    """``value`` as a sharding-strategy name when it is one (a name, number or torch enum)."""
    if value is None or isinstance(value, bool):
        return None
    name = _name(value)
    if name.isdigit() and 1 <= int(name) <= len(SHARDING_STRATEGIES):
        return SHARDING_STRATEGIES[int(name) - 1]
    return name if name in SHARDING_STRATEGIES else None


def _reshard_setting(
    reshard: Any, strategy: str, version: int, strategy_given: bool
) -> tuple[bool | None, str]:
    """Read ``reshard_after_forward`` as Accelerate does: a bool (FSDP2) or a strategy (FSDP1).

    Accelerate's FSDP1 takes the sharding strategy in ``reshard_after_forward`` (transformers'
    Trainer passes ``"full_shard"`` there); under FSDP2 ``FULL_SHARD``/``SHARD_GRAD_OP`` there
    mean ``True``/``False``.

    Returns:
        The flag (``None``: unset) and the sharding strategy.
    """
    named = _strategy_name(reshard)
    if named is None:
        return (None if reshard is None else _flag("reshard_after_forward", reshard)), strategy
    if version == 2:
        if named not in ("FULL_SHARD", "SHARD_GRAD_OP"):
            raise AcceleratorConfigError(
                f"reshard_after_forward={reshard!r} has no FSDP2 equivalent in accel; use true "
                "(FULL_SHARD) or false (SHARD_GRAD_OP), or set fsdp_version: 1."
            )
        return named == "FULL_SHARD", strategy
    if strategy_given and named != strategy:
        raise AcceleratorConfigError(
            f"sharding_strategy={strategy} and reshard_after_forward={reshard!r} disagree (under "
            "FSDP1 both name the sharding strategy); set one of them."
        )
    return None, named


def _validate(values: dict[str, Any], strategy_given: bool = False) -> FSDPSettings:
    version = values["fsdp_version"]
    if version not in (1, 2, "1", "2"):
        raise AcceleratorConfigError(
            f"fsdp_version={version!r}: choose 1 (FSDP wrapper) or 2 (fully_shard)."
        )
    version = int(version)
    strategy = _choice("sharding_strategy", values["sharding_strategy"], SHARDING_STRATEGIES)
    reshard, strategy = _reshard_setting(
        values.get("reshard_after_forward"), strategy, version, strategy_given
    )
    if version == 2:
        if strategy in ("NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
            raise AcceleratorConfigError(
                f"fsdp_sharding_strategy={strategy} has no FSDP2 equivalent in accel; use "
                "FULL_SHARD or SHARD_GRAD_OP (reshard_after_forward), or set fsdp_version: 1."
            )
        if reshard is None:
            reshard = strategy == "FULL_SHARD"
    elif reshard is not None:
        raise AcceleratorConfigError(
            f"reshard_after_forward={reshard!r} is an FSDP2 setting; with fsdp_version: 1 use "
            "fsdp_sharding_strategy (FULL_SHARD or SHARD_GRAD_OP) instead."
        )
    policy_value = values.get("auto_wrap_policy")
    names = _class_names(values.get("transformer_cls_names_to_wrap"))
    policy_fn = None
    if policy_value is None:
        policy = "TRANSFORMER_BASED_WRAP" if names else "NO_WRAP"
    elif callable(policy_value):
        # torch's policy functions (module, recurse, nonwrapped_numel), e.g. PEFT's.
        policy, policy_fn = "CALLABLE", policy_value
    else:
        policy = _choice("auto_wrap_policy", policy_value, WRAP_POLICIES)
    if policy == "TRANSFORMER_BASED_WRAP" and not names:
        raise AcceleratorConfigError(
            "fsdp_auto_wrap_policy=TRANSFORMER_BASED_WRAP needs the layer classes: set "
            "fsdp_transformer_layer_cls_to_wrap (transformer_cls_names_to_wrap), e.g. 'Block'."
        )
    state_dict_type = _choice("state_dict_type", values["state_dict_type"], STATE_DICT_TYPES)
    if state_dict_type not in WRITABLE_STATE_DICT_TYPES:
        raise AcceleratorConfigError(
            f"fsdp_state_dict_type={state_dict_type} cannot be written by accel's save_state; "
            "use SHARDED_STATE_DICT (resharding checkpoints) or FULL_STATE_DICT."
        )
    offload = _offload_flag(values["cpu_offload"])
    use_orig_params = _flag("use_orig_params", values["use_orig_params"])
    if version == 1 and not use_orig_params:
        raise AcceleratorConfigError(
            "fsdp_use_orig_params=false is not supported: accel rebinds optimizers built before "
            "prepare to the sharded parameters, which needs fsdp_use_orig_params: true."
        )
    return FSDPSettings(
        fsdp_version=version,
        sharding_strategy=strategy,
        reshard_after_forward=bool(reshard),
        backward_prefetch=_choice(
            "backward_prefetch", values["backward_prefetch"], BACKWARD_PREFETCH
        ),
        mixed_precision_policy=values.get("mixed_precision_policy"),
        wrap_policy=policy,
        layer_class_names=names,
        min_num_params=int(values["min_num_params"]),
        cpu_offload=offload,
        state_dict_type=state_dict_type,
        use_orig_params=use_orig_params,
        sync_module_states=_flag("sync_module_states", values["sync_module_states"]),
        forward_prefetch=_flag("forward_prefetch", values["forward_prefetch"]),
        activation_checkpointing=_flag(
            "activation_checkpointing", values["activation_checkpointing"]
        ),
        limit_all_gathers=_flag("limit_all_gathers", values["limit_all_gathers"]),
        ignored_modules=values.get("ignored_modules"),
        param_init_fn=_param_init_fn(values.get("param_init_fn")),
        activation_checkpointing_offload=_checkpoint_offload(values, version),
        wrap_policy_fn=policy_fn,
    )


def _offload_flag(value: Any) -> bool:
    """``cpu_offload`` as a flag: a bool, or torch's ``CPUOffload`` / ``OffloadPolicy`` objects."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if isinstance(value, CPUOffloadPolicy):
        return True
    if isinstance(value, OffloadPolicy):
        return False  # torch's "no offloading" policy
    return _flag("cpu_offload", getattr(value, "offload_params", value))


def _torch_policy(version: int | None, dtypes: Mapping[str, Any]) -> Any:
    """The torch ``MixedPrecision`` (FSDP1) or ``MixedPrecisionPolicy`` (FSDP2) for dtypes."""
    if version == 1:
        from torch.distributed.fsdp import MixedPrecision

        keys: tuple[str, ...] = ("param_dtype", "reduce_dtype", "buffer_dtype")
        return MixedPrecision(**{key: dtypes[key] for key in keys if key in dtypes})
    from torch.distributed.fsdp import MixedPrecisionPolicy

    keys = ("param_dtype", "reduce_dtype", "output_dtype")
    return MixedPrecisionPolicy(**{key: dtypes[key] for key in keys if key in dtypes})


def _param_init_fn(value: Any) -> Callable[[torch.nn.Module], None] | None:
    if value is not None and not callable(value):
        raise AcceleratorConfigError(
            f"param_init_fn={value!r}: pass a function taking a module (such as "
            "lambda module: module.to_empty(device=..., recurse=False)), or None."
        )
    return value  # type: ignore[no-any-return]


def _checkpoint_offload(values: Mapping[str, Any], version: int) -> bool:
    offload = _flag("activation_checkpointing_offload", values["activation_checkpointing_offload"])
    if offload and not _flag("activation_checkpointing", values["activation_checkpointing"]):
        raise AcceleratorConfigError(
            "activation_checkpointing_offload=True needs activation_checkpointing=True (only "
            "checkpointed layers' inputs are offloaded)."
        )
    if offload and version != 2:
        raise AcceleratorConfigError(
            "activation_checkpointing_offload=True needs fsdp_version=2 (as in Accelerate)."
        )
    return offload


_CONFIG_TYPES = {
    "FullStateDictConfig": "FULL_STATE_DICT",
    "FullOptimStateDictConfig": "FULL_STATE_DICT",
    "ShardedStateDictConfig": "SHARDED_STATE_DICT",
    "ShardedOptimStateDictConfig": "SHARDED_STATE_DICT",
    "LocalStateDictConfig": "LOCAL_STATE_DICT",
    "LocalOptimStateDictConfig": "LOCAL_STATE_DICT",
}


def _state_dict_type_of_configs(*configs: Any) -> str | None:
    """The state-dict type torch's (optim) state-dict config objects stand for, else None."""
    kinds = set()
    for config in configs:
        if config is None:
            continue
        kind = _CONFIG_TYPES.get(type(config).__name__)
        if kind is None:
            raise AcceleratorConfigError(
                f"state_dict_config/optim_state_dict_config={config!r}: pass one of torch's "
                f"{sorted(_CONFIG_TYPES)} (torch.distributed.fsdp), or None."
            )
        kinds.add(kind)
    if len(kinds) > 1:
        raise AcceleratorConfigError(
            f"state_dict_config and optim_state_dict_config stand for different types "
            f"({sorted(kinds)}); use Full* for both or Sharded* for both."
        )
    return kinds.pop() if kinds else None


def mixed_precision_dtypes(policy: Any, precision: str) -> dict[str, torch.dtype | None]:
    """``param_dtype``/``reduce_dtype``/``buffer_dtype`` from the plugin's policy or the precision.

    Raises:
        AcceleratorConfigError: The policy is neither a dict nor a torch policy object.
    """
    if policy is None:
        # fp8 runs its fp8 layers' matmuls in float8 and everything else in bf16 (Accelerate's).
        compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(
            precision
        )
        if compute is None:
            return {"param_dtype": None, "reduce_dtype": None, "buffer_dtype": None}
        return {"param_dtype": compute, "reduce_dtype": torch.float32, "buffer_dtype": None}
    if isinstance(policy, Mapping):
        unknown = set(policy) - {"param_dtype", "reduce_dtype", "buffer_dtype", "output_dtype"}
        if unknown:
            raise AcceleratorConfigError(
                f"mixed_precision_policy has unknown keys {sorted(unknown)}; use param_dtype, "
                "reduce_dtype, buffer_dtype."
            )
        return {
            key: _dtype(policy.get(key)) for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
        }
    if hasattr(policy, "param_dtype"):
        return {
            key: getattr(policy, key, None)
            for key in ("param_dtype", "reduce_dtype", "buffer_dtype")
        }
    raise AcceleratorConfigError(
        f"mixed_precision_policy={policy!r}: pass a dict of dtypes or torch's MixedPrecisionPolicy."
    )


def _dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value).replace("torch.", ""), None)
    if not isinstance(found, torch.dtype):
        raise AcceleratorConfigError(
            f"mixed_precision_policy dtype {value!r} is not a torch dtype (e.g. 'bfloat16')."
        )
    return found
