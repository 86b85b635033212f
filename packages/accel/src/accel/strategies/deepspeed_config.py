"""Turn a ``DeepSpeedPlugin`` (fields and/or a config file with ``"auto"``) into the engine's config.

Every value comes from one of three places: the user's config file, the plugin's fields, or what
the Accelerator knows (micro-batch size of the prepared dataloader, accumulation steps, mixed
precision, world size). ``"auto"`` (or a missing key) is filled; two places that both set a
value and disagree raise an error naming both. No deepspeed import here.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from accel.errors import AcceleratorConfigError

if TYPE_CHECKING:  # the plugin calls into this module; here it is only a type
    from accel.utils.deepspeed import DeepSpeedPlugin, DummyOptim, DummyScheduler

AUTO = "auto"
DEFAULT_ZERO_STAGE = 2


@dataclasses.dataclass(frozen=True)
class KnownValues:
    """What the Accelerator knows when the engine is built.

    Attributes:
        micro_batch_size: Per-process batch size of the prepared dataloader (``None``: unknown).
        gradient_accumulation_steps: The Accelerator's micro-steps per optimizer step.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        world_size: Number of processes.
    """

    micro_batch_size: int | None
    gradient_accumulation_steps: int
    mixed_precision: str
    world_size: int


def zero_stage_of(plugin: DeepSpeedPlugin) -> int:
    """The ZeRO stage the plugin asks for (plugin field, else config file, else 2)."""
    if plugin.zero_stage is not None:
        return plugin.zero_stage
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
    if plugin.gradient_accumulation_steps is not None:
        candidates.append(
            ("DeepSpeedPlugin.gradient_accumulation_steps", plugin.gradient_accumulation_steps)
        )
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
    stage = plugin.zero_stage
    if stage is None and plugin.hf_ds_config is None:
        stage = DEFAULT_ZERO_STAGE
    values: list[tuple[str, Any, str]] = [
        ("zero_optimization.stage", stage, "zero_stage"),
        ("gradient_clipping", plugin.gradient_clipping, "gradient_clipping"),
        (
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            plugin.zero3_save_16bit_model,
            "zero3_save_16bit_model",
        ),
    ]
    for kind in ("optimizer", "param"):
        device = getattr(plugin, f"offload_{kind}_device")
        if device is not None and device != "none":
            values.append(
                (f"zero_optimization.offload_{kind}.device", device, f"offload_{kind}_device")
            )
            path = getattr(plugin, f"offload_{kind}_nvme_path")
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
) -> dict[str, Any]:
    """The complete engine config: file, then plugin fields, then the Accelerator's values.

    Raises:
        AcceleratorConfigError: Two sources disagree, a value stays ``"auto"`` with nothing to
            fill it, or a dummy optimizer/scheduler does not match the file.
    """
    config = copy.deepcopy(plugin.config_file or {})
    for path, value, source in _plugin_values(plugin):
        fill(config, path, value, source)
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
    if _get(config, "gradient_clipping") == AUTO:
        del config["gradient_clipping"]
    _fill_dummies(config, optimizer, scheduler)
    config.setdefault("zero_allow_untested_optimizer", True)
    config.setdefault("steps_per_print", 2**62)
    leftover = _auto_paths(config)
    if leftover:
        raise AcceleratorConfigError(
            f'The DeepSpeed config still holds "auto" at {", ".join(leftover)} and accel has no '
            "value for it; write the value in the config file."
        )
    return config


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
    config: dict[str, Any], optimizer: DummyOptim | None, scheduler: DummyScheduler | None
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
        values = {
            "warmup_num_steps": scheduler.warmup_num_steps,
            "total_num_steps": scheduler.total_num_steps,
            **scheduler.kwargs,
        }
        if optimizer is not None:
            values.setdefault("warmup_max_lr", optimizer.lr)
        for key, value in values.items():
            if _get(config, f"scheduler.params.{key}") == AUTO:
                fill(config, f"scheduler.params.{key}", value, f"DummyScheduler({key}=...)")


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        found: list[str] = []
        for key, value in node.items():
            found += _auto_paths(value, f"{prefix}{key}.")
        return found
    return [prefix.rstrip(".")] if node == AUTO else []
