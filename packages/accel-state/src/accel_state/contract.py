"""The launcher-to-worker environment contract.

The launcher (``accel launch``, ``notebook_launcher`` or any tool that wants the same behaviour) starts
workers with PyTorch's standard variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...) plus the
variables below. This module is the only place that names or parses them: the launcher writes them with
:meth:`LaunchContract.to_env` and workers read them with :meth:`LaunchContract.from_env`.

What each variable means is in :data:`VARIABLE_DESCRIPTIONS` (the documentation's environment
reference is generated from it).

Every worker also gets Accelerate's own variables for the same settings, with the values
``accelerate launch`` gives them (``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_CPU``,
``ACCELERATE_USE_FSDP`` with ``FSDP_*``, ``ACCELERATE_USE_DEEPSPEED`` with
``ACCELERATE_DEEPSPEED_*``...; see :mod:`accel_state.accelerate_env`): libraries such as
transformers read those. Set by hand without accel's own, they are read too.

``restart_count`` is the sum of ``TORCHELASTIC_RESTART_COUNT`` and ``SLURM_RESTART_COUNT``.

What flows back from workers to the launcher is written down here too: a worker that fails writes
torch elastic's error file (``TORCHELASTIC_ERROR_FILE``); under ``extraInfo`` it may add
:data:`COLLECTIVES_KEY`, a one-line account of the collective it waits in or last entered (see
:mod:`accel_state.failures`). A job stopped by SIGTERM (preemption) ends with
:data:`REQUEUE_EXIT_CODE`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from accel_state import accelerate_env
from accel_state.envvars import read_bool, read_choice, read_int, str_to_bool
from accel_state.errors import EnvironmentConfigError
from accel_state.types import PrecisionType

MIXED_PRECISION = "ACCEL_MIXED_PRECISION"
USE_CPU = "ACCEL_USE_CPU"
GRADIENT_ACCUMULATION_STEPS = "ACCEL_GRADIENT_ACCUMULATION_STEPS"
DEBUG_MODE = "ACCEL_DEBUG_MODE"
#: Accelerate's spelling of the debug switch, honoured beside ``ACCEL_DEBUG_MODE``.
ACCELERATE_DEBUG_MODE = "ACCELERATE_DEBUG_MODE"
DYNAMO_BACKEND = "ACCEL_DYNAMO_BACKEND"
DYNAMO_MODE = "ACCEL_DYNAMO_MODE"
DYNAMO_USE_FULLGRAPH = "ACCEL_DYNAMO_USE_FULLGRAPH"
DYNAMO_USE_DYNAMIC = "ACCEL_DYNAMO_USE_DYNAMIC"
DYNAMO_USE_REGIONAL_COMPILATION = "ACCEL_DYNAMO_USE_REGIONAL_COMPILATION"
#: Accelerate's spelling, read too.
ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION = "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"
#: Accelerate's spellings of the other ``torch.compile`` settings (accel's own variable wins).
ACCELERATE_DYNAMO_BACKEND = "ACCELERATE_DYNAMO_BACKEND"
ACCELERATE_DYNAMO_MODE = "ACCELERATE_DYNAMO_MODE"
ACCELERATE_DYNAMO_USE_FULLGRAPH = "ACCELERATE_DYNAMO_USE_FULLGRAPH"
ACCELERATE_DYNAMO_USE_DYNAMIC = "ACCELERATE_DYNAMO_USE_DYNAMIC"
#: The device to compute on, overriding the automatic choice (accel's and Accelerate's names).
TORCH_DEVICE = "ACCEL_TORCH_DEVICE"
ACCELERATE_TORCH_DEVICE = "ACCELERATE_TORCH_DEVICE"
USE_DEEPSPEED = "ACCEL_USE_DEEPSPEED"
ACCELERATE_USE_DEEPSPEED = "ACCELERATE_USE_DEEPSPEED"
DEEPSPEED_CONFIG = "ACCEL_DEEPSPEED_CONFIG"
USE_FSDP = "ACCEL_USE_FSDP"
ACCELERATE_USE_FSDP = "ACCELERATE_USE_FSDP"
FSDP_CONFIG = "ACCEL_FSDP_CONFIG"
BACKEND = "ACCEL_BACKEND"
PROCESS_GROUP_TIMEOUT = "ACCEL_PROCESS_GROUP_TIMEOUT"
DOWNCAST_BF16 = "ACCEL_DOWNCAST_BF16"
USE_PARALLELISM_CONFIG = "ACCEL_USE_PARALLELISM_CONFIG"
ACCELERATE_USE_PARALLELISM_CONFIG = "ACCELERATE_USE_PARALLELISM_CONFIG"
#: Prefix of the ``ParallelismConfig`` variables (Accelerate's names, read by both libraries).
PARALLELISM_CONFIG_PREFIX = "PARALLELISM_CONFIG_"
#: The ``ParallelismConfig`` settings a launcher hands over, in Accelerate's key names.
PARALLELISM_CONFIG_KEYS = (
    "dp_replicate_size",
    "dp_shard_size",
    "tp_size",
    "cp_size",
    "cp_backend",
    "cp_comm_strategy",
    "sp_size",
    "sp_backend",
    "sp_seq_length",
    "sp_seq_length_is_variable",
    "sp_attn_implementation",
)
#: Set by ``accel launch --as-accelerate``: accel's start-up hook serves ``import accelerate``.
AS_ACCELERATE = "ACCEL_AS_ACCELERATE"
FP8_BACKEND = "ACCEL_FP8_BACKEND"
FP8_CONFIG = "ACCEL_FP8_CONFIG"
#: Written by torch elastic: restarts of the worker group so far.
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
#: Written by SLURM: how many times the job was requeued (added to ``restart_count``).
SLURM_RESTART_COUNT = "SLURM_RESTART_COUNT"
#: Key under ``extraInfo`` of torch elastic's error file: where the failed worker's collectives were.
COLLECTIVES_KEY = "accel_collectives"
#: Written by ``accel launch --ft_replicas N``: this process's replica group, ``0..N-1``.
FT_REPLICA_ID = "ACCEL_FT_REPLICA_ID"
#: Written by ``accel launch --ft_replicas N``: how many replica groups the job has.
FT_REPLICAS = "ACCEL_FT_REPLICAS"
#: Written by ``accel launch --ft_replicas N``: fewest replica groups a step commits with.
FT_MIN_REPLICAS = "ACCEL_FT_MIN_REPLICAS"
#: Written by ``accel launch --ft_replicas N``: times this replica group was relaunched.
FT_GROUP_RESTART_COUNT = "ACCEL_FT_GROUP_RESTART_COUNT"
#: Written by ``accel launch --ft_replicas N``: a file that launcher creates once one of its
#: replica groups has finished the job; a relaunched group that finds it has nothing to train.
FT_JOB_FINISHED_FILE = "ACCEL_FT_JOB_FINISHED_FILE"
#: torchft's own variable: the lighthouse's address (``http://host:port``), read by its Manager.
FT_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"
#: Written by ``accel launch --ft_lighthouse``: this machine's address as the other replica groups
#: reach it (the address of the interface that routes to the lighthouse), which torchft publishes.
FT_ADDRESS = "ACCEL_FT_ADDRESS"
#: Exit status of a job stopped by SIGTERM (preemption): ``EX_TEMPFAIL`` of ``sysexits.h``, "try
#: again later". SLURM requeues a job that exits with it where ``slurm.conf`` has
#: ``RequeueExit=75`` (or the batch script runs ``scontrol requeue`` on it).
REQUEUE_EXIT_CODE = 75

ALL_VARIABLES = (
    MIXED_PRECISION,
    USE_CPU,
    GRADIENT_ACCUMULATION_STEPS,
    DEBUG_MODE,
    DYNAMO_BACKEND,
    DYNAMO_MODE,
    DYNAMO_USE_FULLGRAPH,
    DYNAMO_USE_DYNAMIC,
    DYNAMO_USE_REGIONAL_COMPILATION,
    USE_DEEPSPEED,
    DEEPSPEED_CONFIG,
    USE_FSDP,
    FSDP_CONFIG,
    BACKEND,
    PROCESS_GROUP_TIMEOUT,
    DOWNCAST_BF16,
    USE_PARALLELISM_CONFIG,
    FP8_BACKEND,
    FP8_CONFIG,
    TORCH_DEVICE,
    FT_REPLICA_ID,
    FT_REPLICAS,
    FT_MIN_REPLICAS,
    FT_GROUP_RESTART_COUNT,
    FT_JOB_FINISHED_FILE,
    FT_LIGHTHOUSE,
    FT_ADDRESS,
)

#: What each variable of the contract means, for the documentation's environment reference (which
#: is generated from this mapping, so a variable added to :data:`ALL_VARIABLES` without a meaning
#: fails the docs build).
VARIABLE_DESCRIPTIONS: dict[str, str] = {
    MIXED_PRECISION: "`no`, `fp16`, `bf16` or `fp8`",
    USE_CPU: "force the CPU even when an accelerator is present",
    GRADIENT_ACCUMULATION_STEPS: "micro-steps per optimizer step (integer >= 1)",
    DEBUG_MODE: "check shapes across ranks before each collective (Accelerate's "
    "`ACCELERATE_DEBUG_MODE` is read too)",
    DYNAMO_BACKEND: "`torch.compile` backend, `no` to disable (`ACCELERATE_DYNAMO_BACKEND` too)",
    DYNAMO_MODE: "`torch.compile` mode: `default`, `reduce-overhead`... "
    "(`ACCELERATE_DYNAMO_MODE` too)",
    DYNAMO_USE_FULLGRAPH: "`torch.compile(fullgraph=...)` (`ACCELERATE_DYNAMO_USE_FULLGRAPH` too)",
    DYNAMO_USE_DYNAMIC: "`torch.compile(dynamic=...)` (`ACCELERATE_DYNAMO_USE_DYNAMIC` too)",
    DYNAMO_USE_REGIONAL_COMPILATION: "compile each repeated block once "
    "(`accel launch --dynamo_use_regional_compilation`; "
    "`ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION` too)",
    USE_DEEPSPEED: "wrap models with DeepSpeed (`ACCELERATE_USE_DEEPSPEED` too)",
    DEEPSPEED_CONFIG: "JSON object: the launcher's DeepSpeed settings",
    USE_FSDP: "wrap models with FSDP (`ACCELERATE_USE_FSDP` too)",
    FSDP_CONFIG: "JSON object: the launcher's `fsdp_*` settings (without it, Accelerate's "
    "`FSDP_*` variables, e.g. `FSDP_SHARDING_STRATEGY`, are read)",
    BACKEND: "communication backend: `gloo`, `nccl`, `mpi`...",
    PROCESS_GROUP_TIMEOUT: "seconds a collective may wait before every process raises "
    "(`accel launch --collective_timeout`)",
    DOWNCAST_BF16: "on XLA, store float32 tensors as bfloat16",
    USE_PARALLELISM_CONFIG: "build a `ParallelismConfig` (device mesh) in every `Accelerator` "
    "(`ACCELERATE_USE_PARALLELISM_CONFIG` too); its settings come in "
    "`PARALLELISM_CONFIG_<FIELD>` variables under Accelerate's names: "
    + ", ".join(f"`PARALLELISM_CONFIG_{key.upper()}`" for key in PARALLELISM_CONFIG_KEYS),
    FP8_BACKEND: "fp8 backend: `AO` (torchao), `TE` (TransformerEngine) or `MSAMP`",
    FP8_CONFIG: "JSON object: the launcher's fp8 recipe settings (Accelerate's "
    "`ACCELERATE_FP8_*` variables are read too)",
    TORCH_DEVICE: "the device a worker computes on (`cuda:1`, `cpu`...), overriding the "
    "automatic choice (`ACCELERATE_TORCH_DEVICE` too)",
    FT_REPLICA_ID: "`accel launch --ft_replicas N`: this process's replica group, `0..N-1`",
    FT_REPLICAS: "`accel launch --ft_replicas N`: how many replica groups the job has",
    FT_MIN_REPLICAS: "`accel launch --ft_min_replicas K`: fewest replica groups a step commits "
    "with",
    FT_GROUP_RESTART_COUNT: "times this replica group was relaunched",
    FT_JOB_FINISHED_FILE: "a file `accel launch --ft_replicas` creates once one of its replica "
    "groups has finished the job: a relaunched group that finds it exits with code 0",
    FT_LIGHTHOUSE: "torchft's own variable: the lighthouse's address (`http://host:port`)",
    FT_ADDRESS: "`accel launch --ft_lighthouse`: this machine's address as the other replica "
    "groups reach it (published by torchft for this group's store, manager and healing copies)",
    AS_ACCELERATE: "`accel launch --as-accelerate`: accel's start-up hook makes "
    "`import accelerate` give accel in every Python process",
    RESTART_COUNT: "written by torch elastic: restarts of the worker group so far",
    SLURM_RESTART_COUNT: "written by SLURM: how many times the job was requeued (added to "
    "`restart_count`)",
}

BACKENDS = ["gloo", "nccl", "mpi", "ccl", "xla", "xccl", "hccl"]
FP8_BACKENDS = ["AO", "TE", "MSAMP"]
#: Accelerate's ``ACCELERATE_FP8_<NAME>`` variables: recipe field and how its text is read.
_ACCELERATE_FP8_FIELDS = {
    "USE_AUTOCAST_DURING_EVAL": ("use_autocast_during_eval", "bool"),
    "MARGIN": ("margin", "int"),
    "INTERVAL": ("interval", "int"),
    "FORMAT": ("fp8_format", "str"),
    "AMAX_HISTORY_LEN": ("amax_history_len", "int"),
    "AMAX_COMPUTE_ALGO": ("amax_compute_algo", "str"),
    "OPT_LEVEL": ("opt_level", "str"),
    "ENABLE_FSDP_FLOAT8_ALL_GATHER": ("enable_fsdp_float8_all_gather", "bool"),
    "PAD_INNER_DIM": ("pad_inner_dim", "bool"),
    "USE_MXFP8_BLOCK_SCALING": ("use_mxfp8_block_scaling", "bool"),
}
_ACCELERATE_FP8_OVERRIDES = ("FPROP", "DGRAD", "WGRAD")


def _read_json_object(environ: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise EnvironmentConfigError(f"{name} is not valid JSON ({error.msg}): {raw!r}") from None
    if not isinstance(value, dict):
        raise EnvironmentConfigError(f"{name} must hold a JSON object, got {raw!r}.")
    return value


def _first_set(environ: Mapping[str, str], own: str, accelerate: str) -> str:
    """``own`` (accel's variable) when it holds a value, else Accelerate's spelling ``accelerate``."""
    return own if environ.get(own, "").strip() else accelerate


def parallelism_variable(key: str) -> str:
    """The variable carrying ``ParallelismConfig`` setting ``key``: ``PARALLELISM_CONFIG_TP_SIZE``."""
    return PARALLELISM_CONFIG_PREFIX + key.upper()


def read_parallelism_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``PARALLELISM_CONFIG_*`` settings present in ``environ``, keyed by field name.

    Values stay text; :class:`accel_state.ParallelismConfig` parses and checks them, naming the
    variable when one is malformed.
    """
    env = os.environ if environ is None else environ
    settings = {}
    for key in PARALLELISM_CONFIG_KEYS:
        raw = env.get(parallelism_variable(key))
        if raw is not None and raw.strip() != "":
            settings[key] = raw.strip()
    return settings


def _accelerate_fp8_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """Accelerate's launcher variables (``ACCELERATE_FP8_MARGIN=0``...) as recipe fields."""
    config: dict[str, Any] = {}
    for suffix, (key, kind) in _ACCELERATE_FP8_FIELDS.items():
        name = f"ACCELERATE_FP8_{suffix}"
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        if kind == "bool":
            config[key] = str_to_bool(raw, True, name=name)
        elif kind == "int":
            config[key] = read_int(environ, name)
        else:
            config[key] = raw
    overrides = [
        environ.get(f"ACCELERATE_FP8_OVERRIDE_{part}", "") for part in _ACCELERATE_FP8_OVERRIDES
    ]
    if any(raw.strip() for raw in overrides):
        config["override_linear_precision"] = [
            str_to_bool(raw or "false", True, name=f"ACCELERATE_FP8_OVERRIDE_{part}")
            for raw, part in zip(overrides, _ACCELERATE_FP8_OVERRIDES, strict=True)
        ]
    return config


def _read_fp8_backend(environ: Mapping[str, str]) -> str | None:
    for name in (FP8_BACKEND, "ACCELERATE_FP8_BACKEND"):
        raw = environ.get(name, "").strip().upper()
        if raw in ("", "NO"):
            continue
        if raw not in FP8_BACKENDS:
            raise EnvironmentConfigError(
                f"{name}={environ[name]!r} is not an fp8 backend; use one of {', '.join(FP8_BACKENDS)}."
            )
        return raw
    return None


def _read_positive_float(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise EnvironmentConfigError(f"{name}={raw!r} is not a number of seconds.") from None
    if value <= 0:
        raise EnvironmentConfigError(f"{name}={raw!r} must be a positive number of seconds.")
    return value


@dataclasses.dataclass(frozen=True)
class LaunchContract:
    """Settings a launcher hands to its workers through the environment.

    Attributes mirror the ``accel launch`` flags; the module docstring lists the variables.
    """

    mixed_precision: PrecisionType = PrecisionType.NO
    use_cpu: bool = False
    gradient_accumulation_steps: int = 1
    debug: bool = False
    dynamo_backend: str = "no"
    dynamo_mode: str | None = None
    dynamo_use_fullgraph: bool = False
    dynamo_use_dynamic: bool | None = None
    dynamo_use_regional_compilation: bool = False
    use_deepspeed: bool = False
    deepspeed_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    use_fsdp: bool = False
    fsdp_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    backend: str | None = None
    process_group_timeout: float | None = None
    downcast_bf16: bool = False
    use_parallelism_config: bool = False
    parallelism_config: dict[str, str] = dataclasses.field(default_factory=dict)
    fp8_backend: str | None = None
    fp8_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    restart_count: int = 0
    torch_device: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mixed_precision", _to_precision(self.mixed_precision))
        if self.fp8_backend is not None and self.fp8_backend not in FP8_BACKENDS:
            raise EnvironmentConfigError(
                f"fp8_backend={self.fp8_backend!r} is not known; choose one of "
                f"{', '.join(FP8_BACKENDS)}."
            )
        if self.gradient_accumulation_steps < 1:
            raise EnvironmentConfigError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} must be >= 1."
            )
        if self.use_deepspeed and self.use_fsdp:
            raise EnvironmentConfigError(
                "use_deepspeed and use_fsdp are both set; choose one model-sharding strategy."
            )
        if self.backend is not None and self.backend not in BACKENDS:
            raise EnvironmentConfigError(
                f"backend={self.backend!r} is not known; choose one of {', '.join(BACKENDS)}."
            )
        unknown = sorted(set(self.parallelism_config) - set(PARALLELISM_CONFIG_KEYS))
        if unknown:
            raise EnvironmentConfigError(
                f"parallelism_config has unknown keys {unknown}; known: "
                f"{', '.join(PARALLELISM_CONFIG_KEYS)}."
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchContract:
        """Read the contract from ``environ`` (default: ``os.environ``).

        Raises:
            EnvironmentConfigError: A variable holds a value outside what it accepts.

        """
        env = os.environ if environ is None else environ
        dynamic_name = _first_set(env, DYNAMO_USE_DYNAMIC, ACCELERATE_DYNAMO_USE_DYNAMIC)
        fullgraph_name = _first_set(env, DYNAMO_USE_FULLGRAPH, ACCELERATE_DYNAMO_USE_FULLGRAPH)
        dynamo_backend = env.get(_first_set(env, DYNAMO_BACKEND, ACCELERATE_DYNAMO_BACKEND), "")
        torch_device = env.get(_first_set(env, TORCH_DEVICE, ACCELERATE_TORCH_DEVICE), "").strip()
        backend = read_choice(env, BACKEND, BACKENDS, "") or None
        use_deepspeed = read_bool(env, USE_DEEPSPEED) or read_bool(env, ACCELERATE_USE_DEEPSPEED)
        use_fsdp = read_bool(env, USE_FSDP) or read_bool(env, ACCELERATE_USE_FSDP)
        precision_name = _first_set(env, MIXED_PRECISION, accelerate_env.MIXED_PRECISION)
        steps_name = _first_set(
            env, GRADIENT_ACCUMULATION_STEPS, accelerate_env.GRADIENT_ACCUMULATION_STEPS
        )
        if use_deepspeed and use_fsdp:
            raise EnvironmentConfigError(
                f"{USE_DEEPSPEED} and {USE_FSDP} are both true; a job uses one sharding strategy."
            )
        return cls(
            mixed_precision=PrecisionType(
                read_choice(env, precision_name, PrecisionType.list(), "no")
            ),
            use_cpu=read_bool(env, _first_set(env, USE_CPU, accelerate_env.USE_CPU)),
            gradient_accumulation_steps=read_int(env, steps_name, default=1, minimum=1),
            debug=read_bool(env, DEBUG_MODE) or read_bool(env, ACCELERATE_DEBUG_MODE),
            dynamo_backend=(dynamo_backend or "no").strip().lower(),
            dynamo_mode=env.get(_first_set(env, DYNAMO_MODE, ACCELERATE_DYNAMO_MODE)) or None,
            dynamo_use_fullgraph=read_bool(env, fullgraph_name),
            dynamo_use_dynamic=(
                read_bool(env, dynamic_name) if env.get(dynamic_name, "").strip() else None
            ),
            dynamo_use_regional_compilation=read_bool(env, DYNAMO_USE_REGIONAL_COMPILATION)
            or read_bool(env, ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION),
            use_deepspeed=use_deepspeed,
            deepspeed_config=_read_json_object(env, DEEPSPEED_CONFIG)
            or accelerate_env.accelerate_deepspeed_config(env),
            use_fsdp=use_fsdp,
            fsdp_config=_read_json_object(env, FSDP_CONFIG)
            or accelerate_env.accelerate_fsdp_config(env),
            backend=backend,
            process_group_timeout=_read_positive_float(env, PROCESS_GROUP_TIMEOUT),
            downcast_bf16=read_bool(env, DOWNCAST_BF16),
            use_parallelism_config=read_bool(env, USE_PARALLELISM_CONFIG)
            or read_bool(env, ACCELERATE_USE_PARALLELISM_CONFIG),
            parallelism_config=read_parallelism_settings(env),
            fp8_backend=_read_fp8_backend(env),
            fp8_config=_read_json_object(env, FP8_CONFIG) or _accelerate_fp8_config(env),
            restart_count=read_int(env, RESTART_COUNT, default=0, minimum=0)
            + read_int(env, SLURM_RESTART_COUNT, default=0, minimum=0),
            torch_device=torch_device or None,
        )

    def to_env(self) -> dict[str, str]:
        """Return the variables a launcher sets so that :meth:`from_env` yields this contract.

        Accelerate's spellings of the same settings come too (:mod:`accel_state.accelerate_env`),
        for libraries that read those (transformers' ``TrainingArguments``).
        ``restart_count`` is not among them: torch elastic sets it for every attempt.
        """
        env = {
            MIXED_PRECISION: self.mixed_precision.value,
            USE_CPU: _flag(self.use_cpu),
            GRADIENT_ACCUMULATION_STEPS: str(self.gradient_accumulation_steps),
            DEBUG_MODE: _flag(self.debug),
            DYNAMO_BACKEND: self.dynamo_backend,
            DYNAMO_USE_FULLGRAPH: _flag(self.dynamo_use_fullgraph),
            USE_DEEPSPEED: _flag(self.use_deepspeed),
            USE_FSDP: _flag(self.use_fsdp),
            DOWNCAST_BF16: _flag(self.downcast_bf16),
            USE_PARALLELISM_CONFIG: _flag(self.use_parallelism_config),
        }
        if self.dynamo_mode is not None:
            env[DYNAMO_MODE] = self.dynamo_mode
        if self.dynamo_use_dynamic is not None:
            env[DYNAMO_USE_DYNAMIC] = _flag(self.dynamo_use_dynamic)
        if self.dynamo_use_regional_compilation:
            env[DYNAMO_USE_REGIONAL_COMPILATION] = "true"
        if self.deepspeed_config:
            env[DEEPSPEED_CONFIG] = json.dumps(self.deepspeed_config, sort_keys=True)
        if self.fsdp_config:
            env[FSDP_CONFIG] = json.dumps(self.fsdp_config, sort_keys=True)
        if self.backend is not None:
            env[BACKEND] = self.backend
        if self.process_group_timeout is not None:
            env[PROCESS_GROUP_TIMEOUT] = repr(float(self.process_group_timeout))
        for key, value in self.parallelism_config.items():
            env[parallelism_variable(key)] = str(value)
        if self.fp8_backend is not None:
            env[FP8_BACKEND] = self.fp8_backend
        if self.fp8_config:
            env[FP8_CONFIG] = json.dumps(self.fp8_config, sort_keys=True)
        if self.torch_device is not None:
            env[TORCH_DEVICE] = self.torch_device
        return {**accelerate_env.accelerate_variables(self), **env}


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _to_precision(value: PrecisionType | str) -> PrecisionType:
    try:
        return PrecisionType(value)
    except ValueError:
        raise EnvironmentConfigError(
            f"mixed_precision={value!r} is not valid; choose one of {', '.join(PrecisionType.list())}."
        ) from None


#: torch's Flight Recorder (the NCCL trace buffer): entries kept per process group, dump on a
#: collective timeout, and where the dump goes (``<prefix><rank>``, a pickle torch writes).
FLIGHT_RECORDER_BUFFER = "TORCH_FR_BUFFER_SIZE"
FLIGHT_RECORDER_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
FLIGHT_RECORDER_DUMP_PREFIX = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
#: Entries the Flight Recorder keeps when the user set no size (torchtitan keeps 2000 too).
FLIGHT_RECORDER_ENTRIES = 2000


def flight_recorder_env(dump_prefix: str | None = None) -> dict[str, str]:
    """Variables that make torch's Flight Recorder trace NCCL collectives and dump on a timeout.

    They must be set before the NCCL process group starts. A launcher passes ``dump_prefix`` (a
    folder of its own plus a file prefix) to read every rank's dump after a hang.
    """
    env = {
        FLIGHT_RECORDER_BUFFER: str(FLIGHT_RECORDER_ENTRIES),
        FLIGHT_RECORDER_DUMP_ON_TIMEOUT: "1",
    }
    if dump_prefix is not None:
        env[FLIGHT_RECORDER_DUMP_PREFIX] = dump_prefix
    return env
