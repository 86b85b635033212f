"""Accelerate's launcher variables, written beside accel's own for every worker.

transformers' ``TrainingArguments`` and other libraries read what ``accelerate launch`` sets
(``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_FSDP``, ``FSDP_*``, ``ACCELERATE_USE_DEEPSPEED``,
``ACCELERATE_DEEPSPEED_*``, ``ACCELERATE_USE_CPU``, ``ACCELERATE_DYNAMO_*``...), not accel's
``ACCEL_*`` names. :func:`accelerate_variables` gives those variables for a launch contract, with
the values ``accelerate launch`` would set; :mod:`accel_state.contract` adds them to every
worker's environment and reads them back where accel's own variable is absent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accel_state.contract import LaunchContract

MIXED_PRECISION = "ACCELERATE_MIXED_PRECISION"
USE_CPU = "ACCELERATE_USE_CPU"
GRADIENT_ACCUMULATION_STEPS = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
USE_FSDP = "ACCELERATE_USE_FSDP"
#: Read by transformers' ``is_fsdp_enabled()``: load full weights on local rank 0 only.
RAM_EFFICIENT_LOADING = "FSDP_CPU_RAM_EFFICIENT_LOADING"
SYNC_MODULE_STATES = "FSDP_SYNC_MODULE_STATES"
#: ``fsdp_*`` launcher keys -> Accelerate's ``FSDP_*`` variable (the rest: upper-cased key).
_FSDP_RENAMES = {"fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP"}
#: DeepSpeed launcher keys -> Accelerate's variable.
_DEEPSPEED_VARIABLES = {
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "gradient_accumulation_steps": GRADIENT_ACCUMULATION_STEPS,
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "offload_optimizer_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    "offload_param_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "deepspeed_moe_layer_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
}


def _text(value: Any, lower_bools: bool = True) -> str:
    """A setting as Accelerate writes it: lists comma-joined, booleans ``true``/``false``."""
    if isinstance(value, bool):
        text = str(value)
        return text.lower() if lower_bools else text
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


def fsdp_variables(fsdp_config: Mapping[str, Any]) -> dict[str, str]:
    """``ACCELERATE_USE_FSDP`` and one ``FSDP_*`` variable per ``fsdp_*`` setting given."""
    env = {USE_FSDP: "true", "FSDP_VERSION": str(fsdp_config.get("fsdp_version", 1))}
    for key, value in fsdp_config.items():
        if value is None or not key.startswith("fsdp_"):
            continue
        name = _FSDP_RENAMES.get(key, "FSDP_" + key.removeprefix("fsdp_").upper())
        env[name] = _text(value)
    if _on(fsdp_config.get("fsdp_cpu_ram_efficient_loading")):
        # As `accelerate launch`: rank-0-only loading goes with starting from rank 0's weights.
        env.setdefault(SYNC_MODULE_STATES, "true")
    return env


def _on(value: Any) -> bool:
    """A setting that is on: ``True`` or the text ``true``/``1``/``yes``."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def ram_efficient_loading_variables(enabled: bool) -> dict[str, str]:
    """What transformers' ``from_pretrained`` reads to load full weights on local rank 0 only.

    ``is_fsdp_enabled()`` needs ``ACCELERATE_USE_FSDP`` and ``FSDP_CPU_RAM_EFFICIENT_LOADING``;
    ``FSDP_SYNC_MODULE_STATES`` says the other ranks start from rank 0's weights. Disabled, only
    ``FSDP_CPU_RAM_EFFICIENT_LOADING`` is written (``false``).
    """
    if not enabled:
        return {RAM_EFFICIENT_LOADING: "false"}
    return {USE_FSDP: "true", RAM_EFFICIENT_LOADING: "true", SYNC_MODULE_STATES: "true"}


def export_ram_efficient_loading(enabled: bool, environ: MutableMapping[str, str]) -> None:
    """Write :func:`ram_efficient_loading_variables` into ``environ`` (this process's, usually).

    The FSDP plugin calls it when ``cpu_ram_efficient_loading`` is set in code, so that a model
    loaded afterwards in the same process is loaded on local rank 0 only, as a launcher's setting
    would make it. A ``ACCELERATE_USE_FSDP`` already set is kept.
    """
    for name, value in ram_efficient_loading_variables(enabled).items():
        if name == USE_FSDP and name in environ:
            continue
        environ[name] = value


def deepspeed_variables(deepspeed_config: Mapping[str, Any]) -> dict[str, str]:
    """``ACCELERATE_USE_DEEPSPEED`` and one ``ACCELERATE_DEEPSPEED_*`` variable per setting given."""
    env = {"ACCELERATE_USE_DEEPSPEED": "true"}
    for key, value in deepspeed_config.items():
        name = _DEEPSPEED_VARIABLES.get(key)
        if name is not None and value is not None:
            env[name] = _text(value)
    return env


def accelerate_variables(contract: LaunchContract) -> dict[str, str]:
    """The variables ``accelerate launch`` sets for workers, for the settings in ``contract``."""
    env = {
        MIXED_PRECISION: contract.mixed_precision.value,
        USE_CPU: str(contract.use_cpu),
        "ACCELERATE_DYNAMO_BACKEND": contract.dynamo_backend.upper(),
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(contract.dynamo_use_fullgraph),
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": str(contract.dynamo_use_regional_compilation),
    }
    # Unset settings stay unset (torch.compile's own defaults), as accel's variables do.
    if contract.dynamo_mode is not None:
        env["ACCELERATE_DYNAMO_MODE"] = contract.dynamo_mode
    if contract.dynamo_use_dynamic is not None:
        env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(contract.dynamo_use_dynamic)
    if contract.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if contract.gradient_accumulation_steps != 1:
        env[GRADIENT_ACCUMULATION_STEPS] = str(contract.gradient_accumulation_steps)
    if contract.use_fsdp:
        env.update(fsdp_variables(contract.fsdp_config))
    if contract.use_deepspeed:
        env.update(deepspeed_variables(contract.deepspeed_config))
    if contract.use_parallelism_config:
        env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    if contract.fp8_backend is not None:
        env["ACCELERATE_FP8_BACKEND"] = contract.fp8_backend
    if contract.torch_device is not None:
        env["ACCELERATE_TORCH_DEVICE"] = contract.torch_device
    return env


def _setting(raw: str) -> Any:
    """A variable's text as the setting it holds: ``true``/``false``, an integer, or the text."""
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return int(raw) if raw.isdigit() else raw


def accelerate_fsdp_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """Accelerate's ``FSDP_*`` variables (``FSDP_SHARDING_STRATEGY=FULL_SHARD``...) as ``fsdp_*`` keys."""
    renamed = {name: key for key, name in _FSDP_RENAMES.items()}
    config: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith("FSDP_") or raw.strip() == "":
            continue
        key = renamed.get(name, "fsdp_" + name.removeprefix("FSDP_").lower())
        config[key] = _setting(raw.strip())
    return config


def accelerate_deepspeed_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """Accelerate's ``ACCELERATE_DEEPSPEED_*`` variables as the launcher's DeepSpeed settings.

    ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` is left out: the contract reads it for every
    strategy.
    """
    config: dict[str, Any] = {}
    for key, name in _DEEPSPEED_VARIABLES.items():
        raw = environ.get(name, "").strip()
        if not raw or key == "gradient_accumulation_steps":
            continue
        value = _setting(raw)
        if key == "gradient_clipping" and isinstance(value, str):
            # Text that is not a number stays text: the DeepSpeed strategy names the bad value.
            with contextlib.suppress(ValueError):
                value = float(value)
        config[key] = value
    return config
