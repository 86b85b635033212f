"""``FullyShardedDataParallelPlugin``: FSDP settings under Accelerate's field names.

Every field left at ``None`` is taken from the launcher (``accel launch --use_fsdp --fsdp_*`` or the
``fsdp_config`` section of a config file, carried by the launch contract), then from the defaults.
The choices, defaults and validation live in :mod:`accel.strategies.fsdp.settings`, the mixed-precision
dtypes in :mod:`accel.strategies.fsdp.precision`; this module keeps the plugin and re-exports their names.

Example:
    >>> from accel import Accelerator, FullyShardedDataParallelPlugin
    >>> plugin = FullyShardedDataParallelPlugin(  # doctest: +SKIP
    ...     auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    ... )
    >>> accelerator = Accelerator(fsdp_plugin=plugin)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from accel.errors import AcceleratorConfigError
from accel.strategies.fsdp.precision import mixed_precision_dtypes, to_dtype, torch_policy
from accel.strategies.fsdp.settings import (
    BACKWARD_PREFETCH,
    CONFIG_TYPES,
    DEFAULTS,
    LAUNCHER_KEYS,
    SHARDING_STRATEGIES,
    STATE_DICT_TYPES,
    WRAP_POLICIES,
    WRITABLE_STATE_DICT_TYPES,
    FSDPSettings,
    choice,
    class_names,
    flag,
    is_fsdp1_sharding_strategy,
    state_dict_type_of_configs,
    upper_name,
    validate_settings,
)
from accel_state.accelerate_env import export_ram_efficient_loading


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
        cpu_ram_efficient_loading: Only local rank 0 reads the full weights into host memory:
            exports ``FSDP_CPU_RAM_EFFICIENT_LOADING`` (with ``ACCELERATE_USE_FSDP``) for
            transformers' ``from_pretrained``, and ``prepare`` accepts models whose tensors are on
            the ``meta`` device on the other ranks, filling their shards from rank 0 by broadcast.
            Needs ``sync_module_states``.
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

    def __post_init__(self) -> None:
        """Export what transformers reads when ``cpu_ram_efficient_loading`` is set in code.

        As Accelerate's plugin does: a model loaded with ``from_pretrained`` after this point is
        loaded in full on local rank 0 only. A value left unset (from the launcher) exports
        nothing: the launcher has written the variables for its workers.
        """
        if self.cpu_ram_efficient_loading is not None:
            export_ram_efficient_loading(
                flag("cpu_ram_efficient_loading", self.cpu_ram_efficient_loading), os.environ
            )

    def resolved(self, launcher: Mapping[str, Any] | None = None) -> FSDPSettings:
        """Combine with the launcher's ``fsdp_config`` and defaults, and validate.

        Raises:
            AcceleratorConfigError: A value is unknown or a combination has no meaning.
        """
        values: dict[str, Any] = dict(DEFAULTS)
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
        if version_unset and is_fsdp1_sharding_strategy(self.sharding_strategy):
            values["fsdp_version"] = 1
        type_unset = self.state_dict_type is None and "fsdp_state_dict_type" not in (launcher or {})
        implied = state_dict_type_of_configs(self.state_dict_config, self.optim_state_dict_config)
        if implied is not None:
            if type_unset:
                values["state_dict_type"] = implied
            elif choice("state_dict_type", values["state_dict_type"], STATE_DICT_TYPES) != implied:
                raise AcceleratorConfigError(
                    f"state_dict_type={values['state_dict_type']!r} but state_dict_config / "
                    f"optim_state_dict_config are {implied} configs; make them agree (or leave "
                    "state_dict_type unset)."
                )
        strategy_given = self.sharding_strategy is not None or (
            (launcher or {}).get("fsdp_sharding_strategy") is not None
        )
        return validate_settings(values, strategy_given=strategy_given)

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
            "cpu_ram_efficient_loading": settings.cpu_ram_efficient_loading,
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
        chosen = choice("state_dict_type", state_dict_type, STATE_DICT_TYPES)
        if chosen not in WRITABLE_STATE_DICT_TYPES:
            raise AcceleratorConfigError(
                f"set_state_dict_type({state_dict_type!r}): accel writes FULL_STATE_DICT or "
                "SHARDED_STATE_DICT only; pass one of those."
            )
        self.state_dict_type = chosen
        for name in ("state_dict_config", "optim_state_dict_config"):
            config = getattr(self, name)
            if config is not None and CONFIG_TYPES.get(type(config).__name__) != chosen:
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
            self.mixed_precision_policy = torch_policy(self.fsdp_version, policy)
        elif isinstance(self.mixed_precision_policy, Mapping):
            mixed_precision_dtypes(self.mixed_precision_policy, "no")  # validates the keys
            self.mixed_precision_policy = torch_policy(
                self.fsdp_version,
                {key: to_dtype(value) for key, value in self.mixed_precision_policy.items()},
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
        if upper_name(self.auto_wrap_policy) != "TRANSFORMER_BASED_WRAP":
            return
        if self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = list(getattr(model, "_no_split_modules", ()) or ())
        present = {type(module).__name__ for module in model.modules()}
        missing = [
            name for name in class_names(self.transformer_cls_names_to_wrap) if name not in present
        ]
        if missing:
            raise AcceleratorConfigError(
                f"transformer_cls_names_to_wrap names {missing}, which {type(model).__name__} "
                f"does not contain; its module classes are {sorted(present)}."
            )


__all__ = [
    "BACKWARD_PREFETCH",
    "LAUNCHER_KEYS",
    "SHARDING_STRATEGIES",
    "STATE_DICT_TYPES",
    "WRAP_POLICIES",
    "WRITABLE_STATE_DICT_TYPES",
    "FSDPSettings",
    "FullyShardedDataParallelPlugin",
    "mixed_precision_dtypes",
]
