"""Accelerate's launch helpers (``accelerate.utils.launch``) over accel's own plan.

Each ``prepare_*`` function takes the namespace ``accel launch``'s parser makes
(:func:`accel_launch.launch_args.build_launch_parser`), resolves it exactly as ``accel launch``
does (:func:`accel_launch.commands.launch.prepare_launch`: config file, then flags) and returns the
command and/or environment a worker needs. The variables are those of the launch contract
(:mod:`accel_state.contract`), so a process started with them is configured as under ``accel launch``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from accel_launch.errors import LaunchArgumentError
from accel_state.types import DistributedType

#: Distributed types whose workers :class:`PrepareForLaunch` gives torch's rank variables.
_MULTI_PROCESS = tuple(
    kind
    for kind in DistributedType
    if kind.name.startswith("MULTI_") or kind in (DistributedType.FSDP, DistributedType.DEEPSPEED)
)


def _plan_env(args: argparse.Namespace) -> tuple[Any, dict[str, str]]:
    from accel_launch.commands.launch import prepare_launch

    _fill_missing_flags(args)
    plan = prepare_launch(args)
    env = dict(os.environ)
    env.update(plan.env)
    return plan, env


def _fill_missing_flags(args: argparse.Namespace) -> None:
    """Give a namespace built by hand (not by the launch parser) every flag it lacks, unset.

    Accelerate's helpers read only the namespace, so callers build one with just the fields
    they care about; a missing ``config_file`` means no config file, a missing
    ``training_script`` that only the environment is wanted.
    """
    from accel_launch.launch_args import build_launch_parser

    for action in build_launch_parser()._actions:
        if action.dest != argparse.SUPPRESS and not hasattr(args, action.dest):
            setattr(
                args, action.dest, None if action.dest == "training_script_args" else action.default
            )


def _free_port(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a one-process launch (``python script.py`` plus the contract).

    Raises:
        LaunchArgumentError: The flags ask for more than one process (use
            :func:`prepare_multi_gpu_env`) or cannot be launched.
    """
    plan, env = _plan_env(args)
    if plan.num_processes != 1 or plan.num_machines != 1:
        raise LaunchArgumentError(
            f"prepare_simple_launcher_cmd_env: num_processes={plan.num_processes}, "
            f"num_machines={plan.num_machines}: this helper starts one process; use "
            "prepare_multi_gpu_env for several."
        )
    return plan.python_command(), env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment of a multi-process launch; fills torchrun's fields on ``args`` too.

    Sets ``args.nproc_per_node``, ``args.nnodes``, ``args.node_rank``, ``args.master_addr`` and
    ``args.master_port`` (as Accelerate does for ``torch.distributed.run``) and returns the
    current environment plus the contract variables, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and ``NPROC``/``NODE_RANK`` (read by
    :class:`PrepareForLaunch`). Add ``RANK``/``LOCAL_RANK`` per process (or let
    :class:`PrepareForLaunch` do it) and each process joins the job.
    """
    port_asked = getattr(args, "main_process_port", None)
    if port_asked == 0:
        # Accelerate's helper reads port 0 as "pick a free port" (`accel launch` refuses 0).
        args.main_process_port = None
    try:
        plan, env = _plan_env(args)
    finally:
        if port_asked == 0:
            args.main_process_port = 0
    host, _, port_text = plan.rdzv_endpoint.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    port = int(port_text or 0) or _free_port(host)
    args.nproc_per_node = str(plan.nproc_per_node)
    args.nnodes = str(plan.num_machines)
    args.node_rank = plan.machine_rank
    args.master_addr = host
    args.master_port = str(port)
    env.update(
        {
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(plan.num_processes),
            "LOCAL_WORLD_SIZE": str(plan.nproc_per_node),
            "NPROC": str(plan.nproc_per_node),
            "NODE_RANK": str(plan.machine_rank),
        }
    )
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Command and environment of a DeepSpeed launch (``args.use_deepspeed`` is set for you).

    accel starts DeepSpeed jobs through torch elastic (the ``standard`` multi-node launcher), so
    the command is ``accel launch`` itself with the same flags and the environment carries the
    DeepSpeed contract (``ACCEL_USE_DEEPSPEED``, ``ACCEL_DEEPSPEED_CONFIG``).
    """
    import sys

    args.use_deepspeed = True
    plan, env = _plan_env(args)
    command = [sys.executable, "-m", "accel_launch.cli", "launch", *launch_flags_of(args)]
    command += [plan.target, *plan.target_args]
    return command, env


def launch_flags_of(args: argparse.Namespace) -> list[str]:
    """The ``accel launch`` flags that give ``args`` again: every option set to a non-default value.

    Used to hand a parsed launch on to another ``accel launch`` process without losing any
    setting (the DeepSpeed flags, the precision, ``--env``...).
    """
    from accel_launch.launch_args import build_launch_parser

    flags: list[str] = []
    for action in build_launch_parser()._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        value = getattr(args, action.dest, action.default)
        if value is None or value == action.default:
            continue
        name = next(
            (o for o in action.option_strings if o.startswith("--")), action.option_strings[0]
        )
        if isinstance(action, argparse._StoreTrueAction):
            flags.append(name)
        elif isinstance(action, argparse._AppendAction):
            for item in value:
                flags += [name, str(item)]
        elif isinstance(value, bool):
            flags.append(f"{name}={str(value).lower()}")
        else:
            flags.append(f"{name}={value}")
    return flags


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Add the XLA variables to ``current_env``: bf16 downcasting and the debug mode.

    ``pod=True`` (TPU pods, started over ``gcloud``) is not supported by accel.

    Raises:
        LaunchArgumentError: ``pod=True``.
    """
    if pod:
        raise LaunchArgumentError(
            "prepare_tpu(pod=True): TPU pods are not supported by accel (it launches on the "
            "machine it runs on); run `accel launch --tpu` on each TPU VM instead."
        )
    if getattr(args, "mixed_precision", None) == "bf16":
        if getattr(args, "downcast_bf16", False):
            current_env["XLA_DOWNCAST_BF16"] = "1"
        else:
            current_env["XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
        current_env["ACCEL_DEBUG_MODE"] = "true"
    return args, current_env


def prepare_sagemager_args_inputs(sagemaker_config: Any, args: argparse.Namespace) -> Any:
    """Accelerate's SageMaker job inputs: not supported by accel.

    Raises:
        LaunchArgumentError: Always; accel launches on machines it runs on, not on SageMaker.
    """
    raise LaunchArgumentError(
        "prepare_sagemager_args_inputs: Amazon SageMaker launches are not supported by accel "
        "(compute_environment AMAZON_SAGEMAKER); use LOCAL_MACHINE and run `accel launch` on the "
        "instances."
    )


class PrepareForLaunch:
    """Wrap a function so that ``torch.multiprocessing`` can start it as one rank of a job.

    Called as ``wrapper(index, *args)`` (what ``torch.multiprocessing.start_processes`` passes), it
    sets ``LOCAL_RANK=index`` and ``RANK=NPROC * NODE_RANK + index`` for a multi-process
    ``distributed_type``, marks the process as forked (``FORK_LAUNCHED=1``) and calls
    ``launcher(*args)``. ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` must already be in the
    environment (see :func:`prepare_multi_gpu_env`).

    Args:
        launcher: The function to run in each process.
        distributed_type: A :class:`~accel_state.types.DistributedType` or its name.
        debug: Start the process group over gloo on the file store named by
            ``ACCELERATE_DEBUG_RDV_FILE`` before calling ``launcher``.
    """

    def __init__(
        self,
        launcher: Callable[..., Any],
        distributed_type: DistributedType | str = "NO",
        debug: bool = False,
    ) -> None:
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        """Set this rank's variables and run the launcher with ``args``."""
        if self.debug:
            import torch.distributed as dist

            world_size = int(os.environ["WORLD_SIZE"])
            rdv_file = os.environ.get("ACCELERATE_DEBUG_RDV_FILE")
            if not rdv_file:
                raise LaunchArgumentError(
                    "PrepareForLaunch(debug=True) needs ACCELERATE_DEBUG_RDV_FILE: a file path "
                    "every process can reach, for the gloo FileStore."
                )
            dist.init_process_group(
                "gloo",
                rank=index,
                world_size=world_size,
                store=dist.FileStore(rdv_file, world_size),  # type: ignore[attr-defined]
            )
        elif self.distributed_type in _MULTI_PROCESS:
            nproc = int(os.environ.get("NPROC", "1"))
            node_rank = int(os.environ.get("NODE_RANK", "0"))
            os.environ["LOCAL_RANK"] = str(index)
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)


#: Switches that choose the distributed mode, and the config ``distributed_type`` each stands for.
_MODE_SWITCHES = {
    "multi_gpu": (DistributedType.MULTI_GPU, DistributedType.MULTI_XPU),
    "use_deepspeed": (DistributedType.DEEPSPEED,),
    "use_fsdp": (DistributedType.FSDP,),
    "tpu": (DistributedType.XLA,),
}


def resolve_launch_args(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Fill every flag of ``args`` the user did not type from the config file, as ``accel launch`` does.

    Accelerate's ``_validate_launch_command``: the config file (``args.config_file``, else the
    default one when it exists) provides each value a flag does not; ``debug`` falls back to
    ``False``, ``mixed_precision`` to ``"no"``, ``num_machines`` to 1 and ``gpu_ids`` to
    ``"all"``. ``args`` is changed in place.

    Returns:
        ``(args, file_config, mixed_precision_from_config)``: the filled namespace, the loaded
        :class:`~accel_launch.config.schema.AccelConfig` (``None`` without a config file), and
        whether ``mixed_precision`` came from the file.

    Raises:
        LaunchArgumentError: Two mode switches were typed together (``--multi_gpu --use_fsdp``).
        ConfigError: The config file or a value is invalid.
    """
    import dataclasses

    from accel_launch.config.files import load_config
    from accel_launch.config.schema import AccelConfig
    from accel_launch.launch_args import typed_value
    from accel_launch.overlay import flags_to_config

    flags = flags_to_config(args)
    loaded, location = load_config(getattr(args, "config_file", None))
    file_config = loaded if location.path is not None else None
    merged = (file_config or AccelConfig()).merged_with(flags)
    mp_from_config = flags.mixed_precision is None and merged.mixed_precision is not None

    def fill(name: str, value: Any) -> None:
        if value is not None and typed_value(args, name) is None and hasattr(args, name):
            setattr(args, name, value)

    for field in dataclasses.fields(merged):
        value = getattr(merged, field.name)
        if dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                fill(inner.name, getattr(value, inner.name))
        else:
            fill(field.name, value)
    if merged.use_cpu:
        args.cpu = True
    if flags.distributed_type is None and merged.distributed_type:
        # No mode switch typed (flags_to_config sets distributed_type for one): the file's mode.
        kind = DistributedType(merged.distributed_type)
        for name, kinds in _MODE_SWITCHES.items():
            setattr(args, name, kind in kinds)
    defaults = {
        "debug": False,
        "mixed_precision": "no",
        "num_machines": 1,
        "gpu_ids": "all",
    }
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args, file_config, mp_from_config


def _hyperparameter_value(text: str) -> bool | int | float | str:
    """``"True"``/``"False"`` -> bool, ``"3"`` -> 3, ``"5e-5"`` -> 5e-05, other text unchanged."""
    if text in ("True", "False"):
        return text == "True"
    try:
        number = float(text)
    except ValueError:
        return text
    return (
        int(number)
        if number.is_integer() and "." not in text and "e" not in text.lower()
        else number
    )


def script_args_to_hyperparameters(script_args: list[str]) -> dict[str, bool | int | float | str]:
    """A script's ``--key value`` arguments as a typed dict (Accelerate's SageMaker hyperparameters).

    ``--key value`` and ``--key=value`` pairs become ``{"key": value}``, with ``True``/``False``
    as booleans and numbers as ``int`` or ``float``; hyphens in keys become underscores.

    Raises:
        ValueError: A flag has no value (an on/off switch such as ``--do_train``): SageMaker passes
            hyperparameters as key/value pairs, so give it an explicit value (``--do_train True``).
    """
    result: dict[str, bool | int | float | str] = {}
    index = 0
    while index < len(script_args):
        item = script_args[index]
        if not item.startswith("-"):
            index += 1
            continue
        key, has_value, value = item.lstrip("-").partition("=")
        if not has_value:
            following = script_args[index + 1] if index + 1 < len(script_args) else None
            if following is None or (following.startswith("-") and not _is_number(following)):
                raise ValueError(
                    f"script argument {item!r} has no value: SageMaker doesn't support argparse "
                    "actions for `store_true` or `store_false` (switches without a value). "
                    f"Please define explicit types, e.g. `{item} True`."
                )
            value = following
            index += 1
        result[key.replace("-", "_")] = _hyperparameter_value(value)
        index += 1
    return result


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _convert_nargs_to_dict(nargs: list[str]) -> dict[str, bool | int | float | str]:
    """Accelerate's name for :func:`script_args_to_hyperparameters` (its parameter ``nargs``).

    Raises:
        ValueError: A flag has no value (see :func:`script_args_to_hyperparameters`).
    """
    return script_args_to_hyperparameters(nargs)


def filter_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser, default_args: list[str] | None = None
) -> argparse.Namespace:
    """The settings of ``args`` that ``parser`` knows, over ``parser``'s defaults.

    ``parser`` parses ``default_args`` (unknown items ignored) into a fresh namespace; each of its
    attributes that ``args`` also has takes ``args``' value. Attributes ``parser`` does not define
    (the launcher's own flags) are dropped, so the result can be handed to a tool with its own
    parser (Accelerate's ``_filter_args``, used to build ``torchrun``'s arguments).
    """
    filtered, _ = parser.parse_known_args(list(default_args or []))
    known = vars(filtered)
    for key, value in vars(args).items():
        if key in known:
            setattr(filtered, key, value)
    return filtered


def env_var_path_add(env_var_name: str, path_to_add: str | os.PathLike[str]) -> str:
    """``os.environ[env_var_name]`` with ``path_to_add`` appended, as the new value (not set).

    Empty entries of the current value are dropped; entries are joined with ``os.pathsep``.
    """
    paths = [part for part in os.environ.get(env_var_name, "").split(os.pathsep) if part]
    paths.append(os.fspath(path_to_add))
    return os.pathsep.join(paths)


def _env_text(value: object) -> str:
    """A launcher setting as variable text: booleans as ``true``/``false``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add every set ``fp8_*`` setting of ``args`` to ``current_env`` as ``ACCELERATE_FP8_<NAME>``.

    ``fp8_override_linear_precision`` (three booleans, or ``"false,false,true"`` as accel's
    parser keeps it) becomes ``ACCELERATE_FP8_OVERRIDE_FPROP``/``_DGRAD``/``_WGRAD``. Settings
    left ``None`` are not written. ``current_env`` is updated in place and returned; workers read
    these variables as the fp8 recipe (:mod:`accel_state.contract`).

    Raises:
        ValueError: ``fp8_override_linear_precision`` does not hold exactly three values.
    """
    for name, value in vars(args).items():
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            parts = (
                [part.strip() for part in value.split(",")]
                if isinstance(value, str)
                else list(value)
            )
            if len(parts) != 3:
                raise ValueError(
                    f"fp8_override_linear_precision={value!r} must hold three values "
                    "(fprop, dgrad, wgrad), e.g. false,false,true."
                )
            for gemm, part in zip(("FPROP", "DGRAD", "WGRAD"), parts, strict=True):
                current_env[f"ACCELERATE_FP8_OVERRIDE_{gemm}"] = _env_text(part)
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = _env_text(value)
    return current_env


#: The ``--parallelism_config_*`` settings written whatever the degrees are.
_PARALLELISM_ALWAYS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend")
_PARALLELISM_SP = ("sp_size", "sp_backend")
_PARALLELISM_SP_ONLY = ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")


def prepare_extend_env_parallelism_config(
    args: argparse.Namespace, current_env: dict[str, str]
) -> dict[str, str]:
    """Add ``args``' ``--parallelism_config_*`` settings to ``current_env`` (in place, returned).

    Sets ``ACCELERATE_USE_PARALLELISM_CONFIG=true`` and ``PARALLELISM_CONFIG_<KEY>`` for each
    setting given (``None`` ones are left to the worker's defaults); the ring-attention strategy
    only with a context-parallel degree above 1, and the sequence-length settings only with a
    sequence-parallel degree above 1, as in Accelerate.
    """

    def setting(key: str) -> Any:
        return getattr(args, f"parallelism_config_{key}", None)

    def size(key: str) -> int:
        value = setting(key)
        return int(value) if value is not None else 1

    keys = [*_PARALLELISM_ALWAYS, *_PARALLELISM_SP]
    if size("cp_size") > 1:
        keys.append("cp_comm_strategy")
    if size("sp_size") > 1:
        keys.extend(_PARALLELISM_SP_ONLY)
    current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    for key in keys:
        value = setting(key)
        if value is not None:
            current_env[f"PARALLELISM_CONFIG_{key.upper()}"] = _env_text(value)
    return current_env
