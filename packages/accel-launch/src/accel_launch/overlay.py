"""Turn parsed ``accel launch`` flags into an :class:`AccelConfig` holding only what was typed."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from accel_launch.config.schema import (
    AccelConfig,
    DeepSpeedConfig,
    DynamoConfig,
    Fp8Config,
    FsdpConfig,
    MpirunConfig,
    ParallelismSection,
    flag_key,
)
from accel_launch.errors import LaunchArgumentError
from accel_launch.launch_args import MEGATRON_LM_FLAGS, typed_value
from accel_state.types import DistributedType

#: Flags that select the distributed type, in the order they are checked for conflicts.
_TYPE_FLAGS = (
    ("use_deepspeed", DistributedType.DEEPSPEED),
    ("use_fsdp", DistributedType.FSDP),
    ("tpu", DistributedType.XLA),
    ("multi_gpu", DistributedType.MULTI_GPU),
)


def _section_values(args: argparse.Namespace, section: type[Any]) -> dict[str, Any]:
    names = [field.name for field in dataclasses.fields(section)]
    return {name: typed_value(args, name) for name in names if typed_value(args, name) is not None}


def _refuse_megatron(args: argparse.Namespace) -> None:
    """Accelerate's Megatron-LM flags parse, but accel has no Megatron-LM engine.

    As in Accelerate, the ``--megatron_lm_*`` settings act only with ``--use_megatron_lm``; that
    switch is refused, naming the settings given with it.

    Raises:
        LaunchArgumentError: ``--use_megatron_lm`` was given.
    """
    if not getattr(args, "use_megatron_lm", None):
        return
    typed = ["--use_megatron_lm"]
    typed += [f"--{name}" for name in MEGATRON_LM_FLAGS if getattr(args, name, None) is not None]
    raise LaunchArgumentError(
        f"{', '.join(typed)}: Megatron-LM is not a target of accel (it has no Megatron-LM "
        "engine). Shard the model with --use_fsdp --fsdp_version 2 or --use_deepspeed, or split "
        "it with --use_parallelism_config (--parallelism_config_tp_size, "
        "--parallelism_config_cp_size) instead."
    )


def flags_to_config(args: argparse.Namespace) -> AccelConfig:
    """The config keys the command line sets; flags not given stay ``None``.

    Raises:
        LaunchArgumentError: Two flags choose different distributed types.
        ConfigError: A value is out of range (the error names the flag).
    """
    _refuse_megatron(args)
    chosen = [(flag, kind) for flag, kind in _TYPE_FLAGS if getattr(args, flag, None)]
    if len(chosen) > 1:
        names = " and ".join(f"--{flag}" for flag, _ in chosen)
        raise LaunchArgumentError(f"{names} cannot be combined; pick one distributed mode.")
    top = {
        name: typed_value(args, name)
        for name in (
            "mixed_precision",
            "num_processes",
            "num_machines",
            "min_num_machines",
            "machine_rank",
            "gpu_ids",
            "main_process_ip",
            "main_process_port",
            "rdzv_backend",
            "rdzv_conf",
            "same_network",
            "main_training_function",
            "downcast_bf16",
            "debug",
            "gradient_accumulation_steps",
            "num_cpu_threads_per_process",
            "max_restarts",
            "monitor_interval",
            "collective_timeout",
            "enable_cpu_affinity",
        )
        if typed_value(args, name) is not None
    }
    if getattr(args, "cpu", None):
        top["use_cpu"] = True
    if getattr(args, "use_parallelism_config", None):
        top["use_parallelism_config"] = True
    if chosen:
        top["distributed_type"] = chosen[0][1].value
    data: dict[str, Any] = dict(top)
    for key, section in (
        ("dynamo_config", DynamoConfig),
        ("deepspeed_config", DeepSpeedConfig),
        ("fsdp_config", FsdpConfig),
        ("parallelism_config", ParallelismSection),
        ("fp8_config", Fp8Config),
        ("mpirun_config", MpirunConfig),
    ):
        values = _section_values(args, section)
        if key == "deepspeed_config":
            values.pop("gradient_accumulation_steps", None)
        if values:
            data[key] = values
    return AccelConfig.from_mapping(data, namer=flag_key)
