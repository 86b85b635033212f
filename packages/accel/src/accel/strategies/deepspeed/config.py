"""Turn a ``DeepSpeedPlugin`` (fields and/or a config file with ``"auto"``) into the engine's config.

Every value comes from one of three places: the user's config file, the plugin's fields, or what
the Accelerator knows (micro-batch size of the prepared dataloader, accumulation steps, mixed
precision, world size). ``"auto"`` (or a missing key) is filled; two places that both set a
value and disagree raise an error naming both. No deepspeed import here.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import TYPE_CHECKING, Any

from accel.errors import AcceleratorConfigError

if TYPE_CHECKING:  # the plugin calls into this module; here it is only a type
    from accel.strategies.deepspeed.plugin import DeepSpeedPlugin, DummyOptim, DummyScheduler

AUTO = "auto"
DEFAULT_ZERO_STAGE = 2
#: What an ``"auto"`` ``gradient_clipping`` becomes (Accelerate's value).
DEFAULT_GRADIENT_CLIPPING = 1.0
#: ZeRO keys whose ``"auto"`` is filled from the model's hidden size.
HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


@dataclasses.dataclass(frozen=True)
class KnownValues:
    """What the Accelerator knows when the engine is built.

    Attributes:
        micro_batch_size: Per-process batch size of the prepared dataloader (``None``: unknown).
        gradient_accumulation_steps: The Accelerator's micro-steps per optimizer step.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        world_size: Number of processes.
        split_batches: Whether each dataloader batch is split between the processes; when not,
            ``DummyScheduler.total_num_steps`` (counted over the whole dataset) is divided by
            ``world_size`` to give each engine's steps.
    """

    micro_batch_size: int | None
    gradient_accumulation_steps: int
    mixed_precision: str
    world_size: int
    split_batches: bool = False


def zero_stage_of(plugin: DeepSpeedPlugin) -> int:
    """The ZeRO stage the plugin asks for (plugin field, else config file, else 2)."""
    own = plugin.own_value("zero_stage")
    if own is not None:
        return int(own)
    stage = (plugin.config_file or {}).get("zero_optimization", {}).get("stage", AUTO)
    return DEFAULT_ZERO_STAGE if stage == AUTO else int(stage)


def accumulation_steps(plugin: DeepSpeedPlugin, accelerator_steps: int) -> int:
    """Reconcile the Accelerator's accumulation steps with the plugin's and the file's.

    The Accelerator's default (1) yields to a value set in the plugin or the file.

    Raises:
        AcceleratorConfigError: Two places set different values.
    """
    candidates: list[tuple[str, int]] = []
    if accelerator_steps != 1:
        candidates.append(("the Accelerator's gradient_accumulation_steps", accelerator_steps))
    candidates += _plugin_accumulation(plugin)
    _check_agreement(candidates)
    return candidates[0][1] if candidates else 1


def plugin_accumulation_steps(plugin: DeepSpeedPlugin) -> int | None:
    """The accumulation steps the plugin itself sets (field or file), ``None`` when unset/"auto".

    Raises:
        AcceleratorConfigError: The field and the file set different values.
    """
    candidates = _plugin_accumulation(plugin)
    _check_agreement(candidates)
    return candidates[0][1] if candidates else None


def _plugin_accumulation(plugin: DeepSpeedPlugin) -> list[tuple[str, int]]:
    candidates: list[tuple[str, int]] = []
    own = plugin.own_value("gradient_accumulation_steps")
    if own is not None:
        candidates.append(("DeepSpeedPlugin.gradient_accumulation_steps", own))
    in_file = (plugin.config_file or {}).get("gradient_accumulation_steps", AUTO)
    if in_file != AUTO:
        candidates.append(("the DeepSpeed config file's gradient_accumulation_steps", int(in_file)))
    return candidates


def _check_agreement(candidates: list[tuple[str, int]]) -> None:
    for name, value in candidates[1:]:
        if value != candidates[0][1]:
            raise AcceleratorConfigError(
                f"{candidates[0][0]}={candidates[0][1]} disagrees with {name}={value}; set one "
                'value (or "auto" in the config file).'
            )


def _get(config: dict[str, Any], path: str) -> Any:
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = config
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


def fill(config: dict[str, Any], path: str, value: Any, source: str) -> None:
    """Set ``path`` to ``value`` unless the config already holds it; equal values pass.

    Raises:
        AcceleratorConfigError: The config holds a different, non-``"auto"`` value.
    """
    if value is None:
        return
    current = _get(config, path)
    if current is None or current == AUTO:
        _set(config, path, value)
        return
    same = (
        float(current) == float(value)
        if _is_number(current) and _is_number(value)
        else current == value
    )
    if not same:
        raise AcceleratorConfigError(
            f"The DeepSpeed config file sets {path}={current!r} but {source} gives {value!r}; "
            f'make them agree or write "auto" in the file.'
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plugin_values(plugin: DeepSpeedPlugin) -> list[tuple[str, Any, str]]:
    """``(config key, value, field)`` of the fields the user set (not those mirroring the config)."""
    stage = plugin.own_value("zero_stage")
    if stage is None and plugin.hf_ds_config is None:
        stage = DEFAULT_ZERO_STAGE
    values: list[tuple[str, Any, str]] = [
        ("zero_optimization.stage", stage, "zero_stage"),
        ("gradient_clipping", plugin.own_value("gradient_clipping"), "gradient_clipping"),
        (
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            plugin.own_value("zero3_save_16bit_model"),
            "zero3_save_16bit_model",
        ),
    ]
    for kind in ("optimizer", "param"):
        device = plugin.own_value(f"offload_{kind}_device")
        if device is not None and device != "none":
            values.append(
                (f"zero_optimization.offload_{kind}.device", device, f"offload_{kind}_device")
            )
            path = plugin.own_value(f"offload_{kind}_nvme_path")
            if device == "nvme" and path:
                values.append(
                    (
                        f"zero_optimization.offload_{kind}.nvme_path",
                        path,
                        f"offload_{kind}_nvme_path",
                    )
                )
    return [(key, value, f"DeepSpeedPlugin.{name}") for key, value, name in values]


def resolve_config(
    plugin: DeepSpeedPlugin,
    known: KnownValues,
    optimizer: DummyOptim | None = None,
    scheduler: DummyScheduler | None = None,
    model: Any = None,
) -> dict[str, Any]:
    """The complete engine config: file, then plugin fields, then the Accelerator's values.

    Every ``"auto"`` Accelerate fills is filled with Accelerate's value: batch sizes and
    accumulation from the Accelerator, ``fp16``/``bf16`` from its mixed precision,
    ``gradient_clipping`` 1.0, the ZeRO bucket sizes from ``model.config.hidden_size``, the
    optimizer's and scheduler's parameters from ``DummyOptim``/``DummyScheduler``.

    Args:
        plugin: The plugin whose config file (and fields) to resolve.
        known: What the Accelerator knows.
        optimizer: The ``DummyOptim`` passed to ``prepare``, if any.
        scheduler: The ``DummyScheduler`` passed to ``prepare``, if any.
        model: The model the engine wraps (its ``config.hidden_size`` sizes the ZeRO buckets).

    Raises:
        AcceleratorConfigError: Two sources disagree, a value stays ``"auto"`` with nothing to
            fill it, or a dummy optimizer/scheduler does not match the file.
    """
    config = copy.deepcopy(plugin.config_file or {})
    for path, value, source in _plugin_values(plugin):
        fill(config, path, value, source)
    _fill_plugin_defaults(plugin, config)
    steps = known.gradient_accumulation_steps
    fill(
        config,
        "gradient_accumulation_steps",
        steps,
        "the Accelerator's gradient_accumulation_steps",
    )
    fill(
        config,
        "train_micro_batch_size_per_gpu",
        known.micro_batch_size,
        "the prepared dataloader's per-process batch size",
    )
    micro = _get(config, "train_micro_batch_size_per_gpu")
    if micro is None or micro == AUTO:
        raise AcceleratorConfigError(
            "DeepSpeed needs train_micro_batch_size_per_gpu: pass the training dataloader to the "
            "same accelerator.prepare call as the model, or set it in the DeepSpeed config file "
            '(or plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = N before prepare).'
        )
    fill(
        config,
        "train_batch_size",
        int(micro) * steps * known.world_size,
        f"micro-batch {micro} x accumulation {steps} x {known.world_size} processes",
    )
    precision = known.mixed_precision
    for kind in ("fp16", "bf16"):
        fill(
            config,
            f"{kind}.enabled",
            precision == kind,
            f"Accelerator(mixed_precision={precision!r})",
        )
    if precision == "fp16" and _get(config, "fp16.auto_cast") is None:
        _set(config, "fp16.auto_cast", True)  # float inputs meet half weights, as under autocast
    _fill_hidden_size_keys(config, model)
    _fill_dummies(config, optimizer, scheduler, known)
    config.setdefault("zero_allow_untested_optimizer", True)
    config.setdefault("steps_per_print", 2**62)
    leftover = _auto_paths(config)
    if leftover:
        hints = "; ".join(f"{path}: {_hint(path)}" for path in leftover)
        raise AcceleratorConfigError(
            f'The DeepSpeed config still holds "auto" at {", ".join(leftover)} and accel has no '
            f"value for it. {hints}."
        )
    return config


def _fill_plugin_defaults(plugin: DeepSpeedPlugin, config: dict[str, Any]) -> None:
    """``"auto"`` left where the plugin has no field value: Accelerate's defaults."""
    defaults = {
        "zero_optimization.stage": zero_stage_of(plugin),
        "gradient_clipping": DEFAULT_GRADIENT_CLIPPING,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "zero_optimization.offload_optimizer.device": "none",
        "zero_optimization.offload_param.device": "none",
    }
    for path, value in defaults.items():
        if _get(config, path) == AUTO:
            _set(config, path, value)


def model_hidden_size(model: Any) -> int | None:
    """``model.config.hidden_size``, else the largest of ``model.config.hidden_sizes``, else ``None``."""
    model_config = getattr(model, "config", None)
    size = getattr(model_config, "hidden_size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    sizes = getattr(model_config, "hidden_sizes", None)
    if isinstance(sizes, (list, tuple)) and sizes:
        return int(max(sizes))
    return None


def _fill_hidden_size_keys(config: dict[str, Any], model: Any) -> None:
    """Fill the ZeRO bucket keys' ``"auto"`` from the model's hidden size (Accelerate's rule).

    Raises:
        AcceleratorConfigError: A key is ``"auto"`` and the model has no hidden size.
    """
    keys = [path for path in HIDDEN_SIZE_KEYS if _get(config, path) == AUTO]
    if not keys:
        return
    hidden = model_hidden_size(model)
    if hidden is None:
        found = (
            "has no `config` attribute"
            if getattr(model, "config", None) is None
            else "has a `config` with neither `hidden_size` nor `hidden_sizes`"
        )
        raise AcceleratorConfigError(
            f'The DeepSpeed config holds "auto" at {", ".join(keys)}, which is filled from the '
            f"model's config.hidden_size (or the largest of config.hidden_sizes), but the model "
            f'({type(model).__name__}) {found}. Replace "auto" for these keys with an integer '
            "in the config file (or in plugin.deepspeed_config before prepare), or give the model "
            "a config with hidden_size."
        )
    values = {
        "zero_optimization.reduce_bucket_size": hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
    }
    for path in keys:
        _set(config, path, values[path])


def _hint(path: str) -> str:
    """How to give a value for an ``"auto"`` key accel cannot fill."""
    if path.startswith("optimizer.params."):
        key = path.removeprefix("optimizer.params.")
        return f"pass DummyOptim(params, {key}=...) or write the value in the file"
    if path == "scheduler.params.total_num_steps":
        return "pass DummyScheduler(optimizer, total_num_steps=...) or write the value in the file"
    if path.startswith("scheduler.params."):
        key = path.removeprefix("scheduler.params.")
        return f"pass DummyScheduler(optimizer, {key}=...) or write the value in the file"
    return "write the value in the config file"


def init_config(plugin: DeepSpeedPlugin) -> dict[str, Any]:
    """The config ``deepspeed.zero.Init`` gets before ``prepare``: file and plugin values, no "auto"."""
    config = copy.deepcopy(plugin.config_file or {})
    for path, value, source in _plugin_values(plugin):
        fill(config, path, value, source)
    for path in _auto_paths(config):
        keys = path.split(".")
        node = config
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    # DeepSpeed's config parser insists on a batch size; zero.Init only reads the ZeRO part.
    if "train_batch_size" not in config:
        config.setdefault("train_micro_batch_size_per_gpu", 1)
    return config


def _fill_dummies(
    config: dict[str, Any],
    optimizer: DummyOptim | None,
    scheduler: DummyScheduler | None,
    known: KnownValues,
) -> None:
    if "optimizer" in config and optimizer is None:
        raise AcceleratorConfigError(
            "The DeepSpeed config file defines an optimizer: pass accel.utils.DummyOptim(params) to "
            "prepare instead of a torch optimizer (or remove the optimizer block)."
        )
    if optimizer is not None:
        if "optimizer" not in config:
            raise AcceleratorConfigError(
                "DummyOptim was passed to prepare but the DeepSpeed config defines no optimizer; "
                "add an optimizer block or pass a real torch optimizer."
            )
        values = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay, **optimizer.kwargs}
        for key, value in values.items():  # DummyOptim's values only fill "auto" or gaps
            if _get(config, f"optimizer.params.{key}") in (None, AUTO):
                _set(config, f"optimizer.params.{key}", value)
    if "scheduler" in config and scheduler is None:
        raise AcceleratorConfigError(
            "The DeepSpeed config file defines a scheduler: pass accel.utils.DummyScheduler to "
            "prepare (or remove the scheduler block)."
        )
    if scheduler is not None and "scheduler" in config:
        for key, value in {
            **scheduler_values(scheduler, optimizer, known),
            **scheduler.kwargs,
        }.items():
            if _get(config, f"scheduler.params.{key}") == AUTO:
                fill(config, f"scheduler.params.{key}", value, f"DummyScheduler({key}=...)")


def scheduler_values(
    scheduler: DummyScheduler, optimizer: DummyOptim | None, known: KnownValues
) -> dict[str, Any]:
    """What a ``DummyScheduler`` gives the config's ``"auto"`` scheduler parameters.

    ``warmup_min_lr`` 0; ``warmup_max_lr`` the followed optimizer's learning rate;
    ``warmup_num_steps`` at least 1 (DeepSpeed 0.19.6 and later reject 0);
    ``total_num_steps`` divided between the processes (rounded up) unless batches are split,
    since it counts the optimizer steps over the whole, unsharded dataset.
    """
    values: dict[str, Any] = {
        "warmup_min_lr": 0,
        "warmup_num_steps": max(1, int(scheduler.warmup_num_steps)),
    }
    max_lr = _learning_rate(scheduler.optimizer)
    if max_lr is None and optimizer is not None:
        max_lr = optimizer.lr
    if max_lr is not None:
        values["warmup_max_lr"] = max_lr
    total = scheduler.total_num_steps
    if total is not None:
        values["total_num_steps"] = (
            int(total) if known.split_batches else math.ceil(int(total) / known.world_size)
        )
    return values


def _learning_rate(optimizer: Any) -> Any:
    """The learning rate of a ``DummyOptim`` (``lr``) or a torch optimizer (``defaults["lr"]``)."""
    defaults = getattr(optimizer, "defaults", None)
    if isinstance(defaults, dict) and "lr" in defaults:
        return defaults["lr"]
    return getattr(optimizer, "lr", None)


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        found: list[str] = []
        for key, value in node.items():
            found += _auto_paths(value, f"{prefix}{key}.")
        return found
    return [prefix.rstrip(".")] if node == AUTO else []
