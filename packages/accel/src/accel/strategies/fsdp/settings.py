"""FSDP settings: the choices, the launcher's keys, defaults, and their validation.

:class:`~accel.strategies.fsdp.plugin.FullyShardedDataParallelPlugin` combines its fields with the
launcher's ``fsdp_config`` and :data:`DEFAULTS`; :func:`validate_settings` reads each value as
Accelerate does (names in any case, torch enums, environment strings) into :class:`FSDPSettings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.torch_compat import fsdp2_api

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

DEFAULTS: dict[str, Any] = {
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
    #: Only rank 0 holds the full weights on the host; the others may build the model on
    #: ``meta`` and get rank 0's weights at ``prepare`` (needs ``sync_module_states``).
    cpu_ram_efficient_loading: bool = False


def is_fsdp1_sharding_strategy(value: Any) -> bool:
    """Whether ``value`` is a member of torch's FSDP1 ``ShardingStrategy`` enum."""
    from torch.distributed.fsdp import ShardingStrategy

    return isinstance(value, ShardingStrategy)


def upper_name(value: Any) -> str:
    """An enum member or a string as an upper-case name (``ShardingStrategy.FULL_SHARD`` too)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return str(getattr(value, "name", value)).upper()


def choice(field: str, value: Any, choices: Sequence[str]) -> str:
    """``value`` as one of ``choices`` (any case, an enum, or Accelerate's old 1-based number)."""
    name = upper_name(value)
    if name.isdigit() and field == "sharding_strategy" and 1 <= int(name) <= 5:
        return SHARDING_STRATEGIES[int(name) - 1]  # Accelerate's old 1-based numbers
    if name not in choices:
        raise AcceleratorConfigError(
            f"FullyShardedDataParallelPlugin({field}={value!r}) is not known; "
            f"choose one of {', '.join(choices)}."
        )
    return name


def flag(field: str, value: Any) -> bool:
    """A boolean setting; the strings ``true``/``false``/``1``/``0`` (environment values) too."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise AcceleratorConfigError(f"{field}={value!r}: use true or false.")
    return bool(value)


def class_names(value: Any) -> tuple[str, ...]:
    """Layer class names from a comma-separated string or a sequence."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(item).strip() for item in items if str(item).strip())


def _strategy_name(value: Any) -> str | None:
    """``value`` as a sharding-strategy name when it is one (a name, number or torch enum)."""
    if value is None or isinstance(value, bool):
        return None
    name = upper_name(value)
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
        return (None if reshard is None else flag("reshard_after_forward", reshard)), strategy
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


def validate_settings(values: dict[str, Any], strategy_given: bool = False) -> FSDPSettings:
    """Read the combined plugin, launcher and default ``values`` into :class:`FSDPSettings`.

    Raises:
        AcceleratorConfigError: A value is not known, or two of them disagree.
    """
    version = values["fsdp_version"]
    if version not in (1, 2, "1", "2"):
        raise AcceleratorConfigError(
            f"fsdp_version={version!r}: choose 1 (FSDP wrapper) or 2 (fully_shard)."
        )
    version = int(version)
    strategy = choice("sharding_strategy", values["sharding_strategy"], SHARDING_STRATEGIES)
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
    names = class_names(values.get("transformer_cls_names_to_wrap"))
    policy_fn = None
    if policy_value is None:
        policy = "TRANSFORMER_BASED_WRAP" if names else "NO_WRAP"
    elif callable(policy_value):
        # torch's policy functions (module, recurse, nonwrapped_numel), e.g. PEFT's.
        policy, policy_fn = "CALLABLE", policy_value
    else:
        policy = choice("auto_wrap_policy", policy_value, WRAP_POLICIES)
    if policy == "TRANSFORMER_BASED_WRAP" and not names:
        raise AcceleratorConfigError(
            "fsdp_auto_wrap_policy=TRANSFORMER_BASED_WRAP needs the layer classes: set "
            "fsdp_transformer_layer_cls_to_wrap (transformer_cls_names_to_wrap), e.g. 'Block'."
        )
    state_dict_type = choice("state_dict_type", values["state_dict_type"], STATE_DICT_TYPES)
    if state_dict_type not in WRITABLE_STATE_DICT_TYPES:
        raise AcceleratorConfigError(
            f"fsdp_state_dict_type={state_dict_type} cannot be written by accel's save_state; "
            "use SHARDED_STATE_DICT (resharding checkpoints) or FULL_STATE_DICT."
        )
    offload = _offload_flag(values["cpu_offload"])
    ram_efficient = flag("cpu_ram_efficient_loading", values["cpu_ram_efficient_loading"])
    sync = flag("sync_module_states", values["sync_module_states"])
    if ram_efficient and not sync:
        raise AcceleratorConfigError(
            "cpu_ram_efficient_loading=True with sync_module_states=False: the ranks other than "
            "0 load no weights, so they must start from rank 0's. Set sync_module_states=True "
            "(fsdp_sync_module_states: true), or cpu_ram_efficient_loading=False."
        )
    use_orig_params = flag("use_orig_params", values["use_orig_params"])
    if version == 1 and not use_orig_params:
        raise AcceleratorConfigError(
            "fsdp_use_orig_params=false is not supported: accel rebinds optimizers built before "
            "prepare to the sharded parameters, which needs fsdp_use_orig_params: true."
        )
    return FSDPSettings(
        fsdp_version=version,
        sharding_strategy=strategy,
        reshard_after_forward=bool(reshard),
        backward_prefetch=choice(
            "backward_prefetch", values["backward_prefetch"], BACKWARD_PREFETCH
        ),
        mixed_precision_policy=values.get("mixed_precision_policy"),
        wrap_policy=policy,
        layer_class_names=names,
        min_num_params=int(values["min_num_params"]),
        cpu_offload=offload,
        state_dict_type=state_dict_type,
        use_orig_params=use_orig_params,
        sync_module_states=sync,
        forward_prefetch=flag("forward_prefetch", values["forward_prefetch"]),
        activation_checkpointing=flag(
            "activation_checkpointing", values["activation_checkpointing"]
        ),
        limit_all_gathers=flag("limit_all_gathers", values["limit_all_gathers"]),
        ignored_modules=values.get("ignored_modules"),
        param_init_fn=_param_init_fn(values.get("param_init_fn")),
        activation_checkpointing_offload=_checkpoint_offload(values, version),
        wrap_policy_fn=policy_fn,
        cpu_ram_efficient_loading=ram_efficient,
    )


def _offload_flag(value: Any) -> bool:
    """``cpu_offload`` as a flag: a bool, or torch's ``CPUOffload`` / ``OffloadPolicy`` objects."""
    if isinstance(value, fsdp2_api("CPUOffloadPolicy")):
        return True
    if isinstance(value, fsdp2_api("OffloadPolicy")):
        return False  # torch's "no offloading" policy
    return flag("cpu_offload", getattr(value, "offload_params", value))


def _param_init_fn(value: Any) -> Callable[[torch.nn.Module], None] | None:
    if value is not None and not callable(value):
        raise AcceleratorConfigError(
            f"param_init_fn={value!r}: pass a function taking a module (such as "
            "lambda module: module.to_empty(device=..., recurse=False)), or None."
        )
    return value  # type: ignore[no-any-return]


def _checkpoint_offload(values: Mapping[str, Any], version: int) -> bool:
    offload = flag("activation_checkpointing_offload", values["activation_checkpointing_offload"])
    if offload and not flag("activation_checkpointing", values["activation_checkpointing"]):
        raise AcceleratorConfigError(
            "activation_checkpointing_offload=True needs activation_checkpointing=True (only "
            "checkpointed layers' inputs are offloaded)."
        )
    if offload and version != 2:
        raise AcceleratorConfigError(
            "activation_checkpointing_offload=True needs fsdp_version=2 (as in Accelerate)."
        )
    return offload


CONFIG_TYPES = {
    "FullStateDictConfig": "FULL_STATE_DICT",
    "FullOptimStateDictConfig": "FULL_STATE_DICT",
    "ShardedStateDictConfig": "SHARDED_STATE_DICT",
    "ShardedOptimStateDictConfig": "SHARDED_STATE_DICT",
    "LocalStateDictConfig": "LOCAL_STATE_DICT",
    "LocalOptimStateDictConfig": "LOCAL_STATE_DICT",
}


def state_dict_type_of_configs(*configs: Any) -> str | None:
    """The state-dict type torch's (optim) state-dict config objects stand for, else None."""
    kinds = set()
    for config in configs:
        if config is None:
            continue
        kind = CONFIG_TYPES.get(type(config).__name__)
        if kind is None:
            raise AcceleratorConfigError(
                f"state_dict_config/optim_state_dict_config={config!r}: pass one of torch's "
                f"{sorted(CONFIG_TYPES)} (torch.distributed.fsdp), or None."
            )
        kinds.add(kind)
    if len(kinds) > 1:
        raise AcceleratorConfigError(
            f"state_dict_config and optim_state_dict_config stand for different types "
            f"({sorted(kinds)}); use Full* for both or Sharded* for both."
        )
    return kinds.pop() if kinds else None
