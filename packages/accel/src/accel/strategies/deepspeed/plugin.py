"""DeepSpeed settings: ``DeepSpeedPlugin``, ``DummyOptim`` and ``DummyScheduler`` (no deepspeed import).

The strategy that builds the engine lives in :mod:`accel.strategies.deepspeed.strategy`; this module only
holds what a user passes in, so ``import accel`` never imports deepspeed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.scheduler import AcceleratedScheduler
from accel.strategies.deepspeed.config import init_config, zero_stage_of
from accel.strategies.deepspeed.hf_config import HfDeepSpeedConfig

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: Plugin fields and the config keys they stand for (Accelerate's mapping).
FIELD_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
_MIXED_PRECISIONS = ("no", "fp16", "bf16")
_DEFAULT_ZERO_STAGE = 2


def import_deepspeed() -> Any:
    """Import deepspeed on first use, with the install hint when it is missing.

    Raises:
        UnsupportedFeatureError: deepspeed is not installed.
    """
    try:
        return importlib.import_module("deepspeed")
    except ImportError as error:
        raise UnsupportedFeatureError(
            f"DeepSpeed was requested but the deepspeed package cannot be imported ({error}); "
            "install it with `pip install 'accel[deepspeed]'`."
        ) from None


def require_deepspeed() -> None:
    """Fail early (at ``Accelerator()``) when DeepSpeed is asked for but not installed.

    Raises:
        UnsupportedFeatureError: deepspeed is not installed.
    """
    if importlib.util.find_spec("deepspeed") is None:
        raise UnsupportedFeatureError(
            "DeepSpeed was requested (deepspeed_plugin or accel launch --use_deepspeed) but the "
            "deepspeed package is not installed; install it with `pip install 'accel[deepspeed]'`."
        )


def load_config_file(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Read a DeepSpeed JSON config from a path, a JSON string or a dict (copied).

    Raises:
        AcceleratorConfigError: The file is missing, is not JSON, or does not hold an object.
    """
    if isinstance(source, HfDeepSpeedConfig):
        return source.config  # live: transformers fills its "auto" entries after making the plugin
    if isinstance(source, Mapping):
        return json.loads(json.dumps(dict(source)))  # type: ignore[no-any-return]
    text = os.fspath(source)
    path = Path(text)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise AcceleratorConfigError(
                f"hf_ds_config={text!r} is not valid JSON (line {error.lineno}, column "
                f"{error.colno}: {error.msg}); fix the file or pass a dict."
            ) from None
    elif text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise AcceleratorConfigError(
                f"hf_ds_config holds a JSON string that does not parse ({error.msg}); fix it."
            ) from None
    else:
        raise AcceleratorConfigError(
            f"hf_ds_config={text!r}: no such file; pass the path of a DeepSpeed JSON config or a dict."
        )
    if not isinstance(data, dict):
        raise AcceleratorConfigError(
            f"hf_ds_config={text!r} holds a JSON {type(data).__name__}; a DeepSpeed config is an object."
        )
    return data


@dataclasses.dataclass
class DeepSpeedPlugin:
    """DeepSpeed settings, with Accelerate's field names. ``None`` means "not set here".

    As in Accelerate, the plugin holds a config dict (:attr:`deepspeed_config`, also
    ``hf_ds_config.config``): the user's file or dict, or for a plugin of fields only one built
    from the fields (batch sizes ``"auto"``). Fields left ``None`` take the launcher's settings
    (``accel launch --use_deepspeed --zero_stage 3``...) when no config is given, and the values
    a readable config sets (``plugin.zero_stage`` is the file's stage).

    Args:
        hf_ds_config: A DeepSpeed config: path of a JSON file, a dict, or an
            :class:`HfDeepSpeedConfig` (its live ``config`` is used); may hold ``"auto"``.
            A path that cannot be read is kept and reported at ``prepare``.
        gradient_accumulation_steps: Micro-steps per optimizer step.
        gradient_clipping: Gradient-norm clipping value the engine applies.
        zero_stage: ZeRO stage, 0 to 3 (default 2 when neither this nor a config file says).
        offload_optimizer_device: ``"none"``, ``"cpu"`` or ``"nvme"`` (ZeRO 1-3).
        offload_param_device: ``"none"``, ``"cpu"`` or ``"nvme"`` (ZeRO-3).
        offload_optimizer_nvme_path: NVMe folder for optimizer offload.
        offload_param_nvme_path: NVMe folder for parameter offload.
        zero3_init_flag: Build models sharded at construction under ZeRO-3
            (see :meth:`zero3_init_context_manager`).
        zero3_save_16bit_model: Keep ``stage3_gather_16bit_weights_on_model_save`` on.
        transformer_moe_cls_names: Comma-separated MoE layer class names (kept for compatibility).
        is_train_batch_min: With several dataloaders in one ``prepare`` call, an ``"auto"``
            ``train_micro_batch_size_per_gpu`` takes the smallest per-process batch size (``True``)
            or the largest (``False``).
        enable_msamp: Accelerate's deprecated MS-AMP FP8 path; ``True`` is refused (MS-AMP is
            not a target of accel; use ``mixed_precision="fp8"`` with torchao).
        msamp_opt_level: MS-AMP's level (``"O1"`` or ``"O2"``), only checked.

    Raises:
        AcceleratorConfigError: A field holds a value outside what it accepts.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    is_train_batch_min: bool = True
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.hf_ds_config is None:
            self._take_launcher_settings()
        self._check_fields()
        self._resolved: dict[str, Any] | None = None
        self._config: dict[str, Any] | None = None
        self._config_owner: Any = None
        self._selected = False
        #: Fields filled from the config (not set by the user): the config stays their source.
        self._derived: dict[str, Any] = {}
        #: transformers' ``HfDeepSpeedConfig`` kept alive by :meth:`set_deepspeed_weakref`.
        self.dschf: Any = None
        if self.hf_ds_config is None:
            self.hf_ds_config = HfDeepSpeedConfig(self._config_of_fields())
            return
        if not isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            try:
                self.hf_ds_config = HfDeepSpeedConfig(load_config_file(self.hf_ds_config))
            except AcceleratorConfigError:
                return  # kept as given; config_file reports it when the config is needed
        self._take_config_values()

    def _check_fields(self) -> None:
        if self.enable_msamp:
            raise UnsupportedFeatureError(
                "DeepSpeedPlugin(enable_msamp=True): MS-AMP is not supported by accel (Accelerate "
                "deprecates it too); use mixed_precision='fp8' (torchao, accel[fp8]) instead."
            )
        if self.msamp_opt_level is not None and self.msamp_opt_level not in ("O1", "O2"):
            raise AcceleratorConfigError(
                f"DeepSpeedPlugin(msamp_opt_level={self.msamp_opt_level!r}): choose 'O1' or 'O2'."
            )
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise AcceleratorConfigError(
                f"DeepSpeedPlugin(zero_stage={self.zero_stage!r}): choose 0, 1, 2 or 3."
            )
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value is not None and value not in _OFFLOAD_DEVICES:
                raise AcceleratorConfigError(
                    f"DeepSpeedPlugin({name}={value!r}): choose one of {', '.join(_OFFLOAD_DEVICES)}."
                )
        steps = self.gradient_accumulation_steps
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise AcceleratorConfigError(
                f"DeepSpeedPlugin(gradient_accumulation_steps={steps!r}): must be an integer >= 1."
            )

    def _take_launcher_settings(self) -> None:
        """Fields left ``None`` take what ``accel launch --use_deepspeed ...`` set (Accelerate's env)."""
        from accel_state.contract import LaunchContract
        from accel_state.errors import EnvironmentConfigError

        try:
            contract = LaunchContract.from_env()
        except EnvironmentConfigError:
            return  # PartialState reports a broken launch environment
        if not contract.use_deepspeed:
            return
        for name, value in self._launch_kwargs(contract.deepspeed_config).items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    def _config_of_fields(self) -> dict[str, Any]:
        """The config of a plugin without one: its fields, batch sizes ``"auto"`` (Accelerate's)."""
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": (
                "auto"
                if self.gradient_accumulation_steps is None
                else self.gradient_accumulation_steps
            ),
            "zero_optimization": {
                "stage": _DEFAULT_ZERO_STAGE if self.zero_stage is None else self.zero_stage
            },
        }
        for name, key in FIELD_KEYS.items():
            value = getattr(self, name)
            if value is not None and name not in ("gradient_accumulation_steps", "zero_stage"):
                _set_key(config, key, value)
        return config

    def _take_config_values(self) -> None:
        """Fields left ``None`` show what the config sets (not ``"auto"``), as in Accelerate."""
        source = self.hf_ds_config
        for name, key in FIELD_KEYS.items():
            value = source.get_value(key)
            if getattr(self, name) is not None or value is None or value == "auto":
                continue
            if name in ("zero_stage", "gradient_accumulation_steps"):
                if not str(value).strip().isdigit():
                    continue  # not a count: DeepSpeed reports it when the engine is built
                value = int(value)
            setattr(self, name, value)
            self._derived[name] = value

    def own_value(self, name: str) -> Any:
        """The field ``name`` as the user (or the launcher) set it; ``None`` if it mirrors the config."""
        value = getattr(self, name)
        if name in self._derived and self._derived[name] == value:
            return None
        return value

    @property
    def selected(self) -> bool:
        """Whether this plugin is the one the next ``prepare`` uses (several plugins)."""
        return self._selected

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Mark this plugin selected; only the state does it (``select_deepspeed_plugin``).

        Raises:
            AcceleratorConfigError: Called directly instead of through the state.
        """
        if not _from_accelerator_state:
            raise AcceleratorConfigError(
                "DeepSpeedPlugin.select(): select a plugin with "
                "accelerator.state.select_deepspeed_plugin(name), so that the others are unselected."
            )
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    @staticmethod
    def _launch_kwargs(settings: Mapping[str, Any]) -> dict[str, Any]:
        """Plugin keyword arguments from the launcher's ``deepspeed_config`` settings."""
        fields = {field.name for field in dataclasses.fields(DeepSpeedPlugin)}
        # Accumulation steps reach the Accelerator through the launch contract itself.
        fields.discard("gradient_accumulation_steps")
        kwargs = {key: value for key, value in settings.items() if key in fields}
        if settings.get("deepspeed_config_file"):
            kwargs["hf_ds_config"] = settings["deepspeed_config_file"]
        if settings.get("deepspeed_moe_layer_cls_names"):
            names = settings["deepspeed_moe_layer_cls_names"]
            kwargs["transformer_moe_cls_names"] = (
                names if isinstance(names, str) else ",".join(names)
            )
        return kwargs

    @classmethod
    def from_launch_config(cls, settings: Mapping[str, Any]) -> DeepSpeedPlugin:
        """The plugin described by the launcher's ``deepspeed_config`` (``--zero_stage``...)."""
        return cls(**cls._launch_kwargs(settings))

    @property
    def config_file(self) -> dict[str, Any] | None:
        """The plugin's config (parsed once, ``"auto"`` values still in), or ``None``.

        It is the live dict of ``hf_ds_config`` (or the one assigned to ``deepspeed_config``):
        changes made to it before ``prepare`` reach the engine.

        Raises:
            AcceleratorConfigError: ``hf_ds_config`` is a path that cannot be read as JSON.
        """
        source = self.hf_ds_config
        if source is None:
            return self._config  # entries written into deepspeed_config before prepare, if any
        if self._config is None or self._config_owner is not source:
            self._config = load_config_file(source)
            self._config_owner = source
        return self._config

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The resolved config the engine received; before ``prepare``, the plugin's config.

        As in Accelerate, entries set in it before ``prepare`` (say
        ``train_micro_batch_size_per_gpu``) are used by the engine; assigning a dict replaces it
        (transformers assigns its ``HfTrainerDeepSpeedConfig``'s).
        """
        if self._resolved is not None:
            return self._resolved
        config = self.config_file
        if config is None:
            config = self._config = {}
        return config

    @deepspeed_config.setter
    def deepspeed_config(self, value: dict[str, Any]) -> None:
        if not isinstance(value, dict):
            raise AcceleratorConfigError(
                f"DeepSpeedPlugin.deepspeed_config = {type(value).__name__}: assign a dict "
                "(a DeepSpeed config)."
            )
        self._config = value
        self._config_owner = self.hf_ds_config
        self._resolved = None

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config's value under a dotted key (``"zero_optimization.stage"``), else ``default``."""
        node: Any = self.deepspeed_config
        for part in ds_key_long.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config holds ``"auto"`` under the dotted key."""
        return bool(self.get_value(ds_key_long) == "auto")

    def set_mixed_precision(self, mixed_precision: Any) -> None:
        """Write the ``fp16``/``bf16`` blocks for ``mixed_precision`` into the config (Accelerate's).

        Blocks the config already has are kept; their ``"auto"`` ``enabled`` is filled.

        Raises:
            UnsupportedFeatureError: ``"fp8"`` (not supported with DeepSpeed in accel).
            AcceleratorConfigError: Another value than ``"no"``, ``"fp16"`` or ``"bf16"``, or
                the config enables the other half-precision type.
        """
        precision = str(getattr(mixed_precision, "value", mixed_precision) or "no").lower()
        if precision == "fp8":
            raise UnsupportedFeatureError(
                "DeepSpeedPlugin.set_mixed_precision('fp8'): fp8 is not supported with DeepSpeed "
                "in accel; use 'bf16', or train in fp8 with DDP or FSDP2."
            )
        if precision not in _MIXED_PRECISIONS:
            raise AcceleratorConfigError(
                f"DeepSpeedPlugin.set_mixed_precision({mixed_precision!r}): choose one of "
                f"{', '.join(_MIXED_PRECISIONS)}."
            )
        config = self.deepspeed_config
        if precision == "fp16":
            config.setdefault("fp16", {"enabled": True, "auto_cast": True})
        elif precision == "bf16":
            config.setdefault("bf16", {"enabled": True})
        if precision != "no":
            other = "bf16" if precision == "fp16" else "fp16"
            if str(config.get(other, {}).get("enabled", False)).lower() == "true":
                raise AcceleratorConfigError(
                    f"mixed_precision={precision!r} but the DeepSpeed config enables {other}; "
                    f'set {other}.enabled to false or "auto", or use mixed_precision={other!r}.'
                )
        for kind in ("fp16", "bf16"):
            block = config.setdefault(kind, {"enabled": False})
            if block.get("enabled") == "auto":
                block["enabled"] = precision == kind

    def set_deepspeed_weakref(self) -> None:
        """Tell transformers this config is on (``is_deepspeed_zero3_enabled()``...), as Accelerate does.

        Keeps a transformers ``HfDeepSpeedConfig`` of the config (``"auto"`` batch values as 1)
        in ``self.dschf``: transformers holds it by weak reference, so ``from_pretrained`` builds
        ZeRO-3 models sharded. Without transformers, ``dschf`` is accel's ``HfDeepSpeedConfig``.
        """
        merged = copy.deepcopy(self.deepspeed_config)
        for name, key in FIELD_KEYS.items():  # fields the config leaves open
            value = self.own_value(name)
            if value is not None and self.get_value(key) in (None, "auto"):
                _set_key(merged, key, value)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if merged.get(key, "auto") == "auto":
                merged[key] = 1
        if merged.get("train_batch_size") == "auto":
            del merged["train_batch_size"]
        try:
            from transformers.integrations import (  # type: ignore[import-not-found,unused-ignore]
                HfDeepSpeedConfig as TransformersConfig,
            )
            from transformers.integrations import (  # type: ignore[import-not-found,unused-ignore]
                unset_hf_deepspeed_config,
            )
        except ImportError:
            self.dschf = HfDeepSpeedConfig(merged)
            return
        unset_hf_deepspeed_config()
        self.dschf = TransformersConfig(merged)

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are built sharded under ZeRO-3 (``zero3_init_flag`` and stage 3)."""
        return bool(self.zero3_init_flag) and zero_stage_of(self) == 3

    def zero3_init_context_manager(
        self, enable: bool = True
    ) -> contextlib.AbstractContextManager[Any]:
        """Context in which models are built already sharded (ZeRO-3 with ``zero3_init_flag``).

        Outside ZeRO-3, with the flag off or ``enable=False``, it does nothing.
        """
        if not enable or not self.is_zero3_init_enabled():
            return contextlib.nullcontext()
        deepspeed = import_deepspeed()
        return deepspeed.zero.Init(config_dict_or_path=init_config(self))  # type: ignore[no-any-return]


def _set_key(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``config``'s entry under a dotted key, making the parent dicts."""
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


class DummyOptim:
    """Stands for the optimizer a DeepSpeed config file defines; ``prepare`` turns it into the real one.

    Args:
        params: The model parameters (or parameter groups).
        lr: Fills ``"auto"`` in ``optimizer.params.lr``.
        weight_decay: Fills ``"auto"`` in ``optimizer.params.weight_decay``.
        **kwargs: Further values for ``"auto"`` entries of ``optimizer.params``.
    """

    def __init__(
        self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0.0, **kwargs: Any
    ) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler a DeepSpeed config file defines.

    Args:
        optimizer: The (dummy) optimizer it follows.
        total_num_steps: Optimizer steps over the whole dataset; fills ``"auto"`` in
            ``scheduler.params.total_num_steps`` divided by the number of processes (rounded
            up), or as given with ``split_batches=True``.
        warmup_num_steps: Fills ``"auto"`` in ``scheduler.params.warmup_num_steps`` (at least 1,
            which DeepSpeed requires). ``warmup_min_lr`` gets 0 and ``warmup_max_lr`` the
            optimizer's learning rate.
        lr_scheduler_callable: Builds a scheduler from the engine's optimizer when the config
            defines none.
        **kwargs: Further values for ``"auto"`` entries of ``scheduler.params``.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class DeepSpeedEngineWrapper:
    """The training engine that ``accelerator.backward`` drives (Accelerate's class).

    ``accelerator.deepspeed_engine_wrapped`` holds one per Accelerator once its model and
    optimizer are prepared; a second model trained under another plugin gets its own
    Accelerator, hence its own wrapper (see :mod:`accel.strategies.deepspeed.named_plugins`).

    Args:
        engine: A ``deepspeed.DeepSpeedEngine``.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._unzero_norm: float | None = None

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        """``engine.backward``; with ``sync_gradients`` (an accumulation boundary) ``engine.step``.

        The engine divides the loss by its accumulation steps, and its step clips, steps the
        optimizer (and its scheduler) and zeroes the gradients.
        """
        engine = self.engine
        engine.set_gradient_accumulation_boundary(sync_gradients)
        engine.backward(loss, **kwargs)
        if sync_gradients:
            if engine.zero_optimization_stage() == 0:
                # Without ZeRO the engine keeps no norm: take it from the reduced grads.
                self._unzero_norm = _total_norm(engine.module.parameters())
            engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last step (before clipping); ``None`` before the first."""
        norm = self.engine.get_global_grad_norm()
        if norm is None:  # stage 0 keeps none
            return self._unzero_norm
        return float(norm.item() if hasattr(norm, "item") else norm)


def _total_norm(parameters: Any) -> float:
    """The 2-norm of all gradients of ``parameters``."""
    import torch

    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def get_active_deepspeed_plugin(state: Any) -> DeepSpeedPlugin:
    """The selected DeepSpeed plugin of ``state`` (an ``AcceleratorState``; several plugins).

    Raises:
        AcceleratorConfigError: The job does not use DeepSpeed.
    """
    registry = getattr(state, "deepspeed_registry", None)
    plugin = None if registry is None else registry.active
    if not isinstance(plugin, DeepSpeedPlugin):
        raise AcceleratorConfigError(
            "get_active_deepspeed_plugin(): this Accelerator has no DeepSpeed plugin; pass "
            "deepspeed_plugin=... or launch with --use_deepspeed."
        )
    return plugin


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """A scheduler the engine built from the config file: the engine steps it."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the engine steps its scheduler with each optimizer step."""
