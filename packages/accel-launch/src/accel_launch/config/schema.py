"""The config file as dataclasses: one per section, every field ``None`` until a file or flag sets it.

The keys and values are Accelerate's (``compute_environment``, ``distributed_type``, nested
``fsdp_config`` / ``deepspeed_config`` / ``dynamo_config``...), so a file written by
``accelerate config`` loads unchanged. Defaults are applied later, when a launch is planned, so that
"unset" and "set to the default" stay distinguishable while files and flags are merged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from accel_launch.config.fields import (
    Parser,
    choice_parser,
    float_parser,
    int_parser,
    parse_bool,
    parse_csv,
    parse_str,
)
from accel_launch.errors import ConfigError
from accel_state.types import ComputeEnvironment, DistributedType, PrecisionType

S = TypeVar("S", bound="Section")
KeyNamer = Callable[[str], str]

RDZV_BACKENDS = ["static", "c10d"]
DYNAMO_BACKENDS = [
    "NO",
    "EAGER",
    "AOT_EAGER",
    "INDUCTOR",
    "AOT_TS_NVFUSER",
    "NVPRIMS_NVFUSER",
    "CUDAGRAPHS",
    "OFI",
    "FX2TRT",
    "ONNXRT",
    "TENSORRT",
    "AOT_TORCHXLA_TRACE_ONCE",
    "TORCHXLA_TRACE_ONCE",
    "IPEX",
    "TVM",
    "HPU_BACKEND",
]
DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
OFFLOAD_DEVICES = ["none", "cpu", "nvme"]
DEEPSPEED_MULTINODE_LAUNCHERS = ["standard", "pdsh", "openmpi", "mvapich", "mpich", "nossh"]
FSDP_SHARDING_STRATEGIES = [
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
]
FSDP_AUTO_WRAP_POLICIES = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPES = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
DISTRIBUTED_TYPES = DistributedType.list()
CP_BACKENDS = ["torch"]
CP_COMM_STRATEGIES = ["allgather", "alltoall"]
SP_BACKENDS = ["deepspeed", "accelerate"]
#: Prefix of the ``parallelism_config`` keys (and ``--parallelism_config_*`` flags).
PARALLELISM_PREFIX = "parallelism_config_"
FP8_BACKENDS = ["AO", "TE", "MSAMP"]
FP8_FORMATS = ["HYBRID", "E4M3", "E5M2"]
FP8_AMAX_COMPUTE_ALGOS = ["max", "most_recent"]
FP8_OPT_LEVELS = ["O1", "O2"]

#: Keys Accelerate writes that accel reads without using (TPU pods, Megatron-LM, IPEX, MPI...).
IGNORED_KEYS = frozenset(
    {
        "tpu_name",
        "tpu_zone",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_env",
        "tpu_vm",
        "command_file",
        "commands",
        "megatron_lm_config",
        "ipex_config",
    }
)


def _opt(parser: Parser, doc: str) -> Any:
    """A field that is ``None`` until set, parsed with ``parser``."""
    return dataclasses.field(default=None, metadata={"parse": parser, "doc": doc})


def file_key(prefix: str) -> KeyNamer:
    """Name keys as they appear in a file: ``fsdp_config.fsdp_offload_params``."""
    return lambda key: f"{prefix}{key}"


def flag_key(key: str) -> str:
    """Name keys as command-line flags: ``--fsdp_offload_params``."""
    return f"--{key}"


class Section:
    """Behaviour shared by the config dataclasses: parse from a mapping, merge, dump."""

    #: Old spellings accepted on input, mapped to the current key.
    ALIASES: ClassVar[dict[str, str]] = {}

    @classmethod
    def from_mapping(
        cls: type[S],
        data: Mapping[str, Any],
        *,
        namer: KeyNamer = flag_key,
        warnings: list[str] | None = None,
    ) -> S:
        """Parse ``data``; unknown keys are reported in ``warnings`` (naming the key) and skipped.

        Raises:
            ConfigError: A value is invalid (the error names the key, the value, what is allowed).
        """
        notes = warnings if warnings is not None else []
        data = cls._normalise(data, namer)
        by_name = {field.name: field for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        for raw_key, raw_value in data.items():
            key = cls.ALIASES.get(str(raw_key), str(raw_key))
            field = by_name.get(key)
            if field is None:
                if not cls._skip_unknown(key, raw_value, namer, notes):
                    notes.append(
                        f"unknown key {namer(str(raw_key))!r} is ignored "
                        "(misspelt, or written by a newer tool?)"
                    )
                continue
            section = field.metadata.get("section")
            if section is not None:
                values[key] = section.from_mapping(
                    _as_mapping(namer(key), raw_value),
                    namer=_nested_namer(namer, key),
                    warnings=notes,
                )
            elif raw_value is not None:
                values[key] = field.metadata["parse"](namer(key), raw_value)
        return cls(**values)

    @classmethod
    def _normalise(cls, data: Mapping[str, Any], namer: KeyNamer) -> Mapping[str, Any]:
        """Rewrite old layouts into the current one before parsing (default: unchanged)."""
        return data

    @classmethod
    def _skip_unknown(cls, key: str, value: Any, namer: KeyNamer, notes: list[str]) -> bool:
        """Return True when ``key`` is not ours but known and quietly ignored."""
        return False

    def to_dict(self) -> dict[str, Any]:
        """The keys that are set, nested sections as mappings (empty sections left out)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if isinstance(value, Section):
                nested = value.to_dict()
                if nested:
                    out[field.name] = nested
            elif value is not None:
                out[field.name] = value
        return out

    def merged_with(self: S, override: S) -> S:
        """Return a copy where every key set in ``override`` replaces this one's value."""
        changes: dict[str, Any] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            mine, theirs = getattr(self, field.name), getattr(override, field.name)
            if isinstance(mine, Section) and isinstance(theirs, Section):
                changes[field.name] = mine.merged_with(theirs)
            elif theirs is not None:
                changes[field.name] = theirs
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _as_mapping(key: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"must be a mapping of keys to values, got {type(value).__name__}", key=key, value=value
        )
    return value


def _nested_namer(namer: KeyNamer, section: str) -> KeyNamer:
    """Nested keys read as ``section.key`` in files and stay ``--key`` on the command line."""
    if namer is flag_key:
        return flag_key
    return lambda key: f"{namer(section)}.{key}"


def _fsdp_sharding_strategy(key: str, value: Any) -> str:
    """FSDP sharding strategy by name, or by Accelerate's old 1-based number."""
    numeric = isinstance(value, int) and not isinstance(value, bool)
    if numeric and 1 <= int(value) <= len(FSDP_SHARDING_STRATEGIES):
        return FSDP_SHARDING_STRATEGIES[int(value) - 1]
    return str(choice_parser(FSDP_SHARDING_STRATEGIES)(key, value))


@dataclasses.dataclass(frozen=True)
class DynamoConfig(Section):
    """``dynamo_config``: how workers call ``torch.compile``."""

    dynamo_backend: str | None = _opt(
        choice_parser(DYNAMO_BACKENDS), "torch.compile backend; NO disables compilation"
    )
    dynamo_mode: str | None = _opt(choice_parser(DYNAMO_MODES, "lower"), "torch.compile mode")
    dynamo_use_fullgraph: bool | None = _opt(parse_bool, "torch.compile(fullgraph=...)")
    dynamo_use_dynamic: bool | None = _opt(parse_bool, "torch.compile(dynamic=...)")
    dynamo_use_regional_compilation: bool | None = _opt(
        parse_bool, "compile each repeated block once (accel.compile_regions)"
    )


@dataclasses.dataclass(frozen=True)
class MpirunConfig(Section):
    """``mpirun_config``: the machines of a multi-CPU job, as a hostfile."""

    mpirun_hostfile: str | None = _opt(
        parse_str, "hostfile listing the machines (host [slots=N] per line)"
    )


@dataclasses.dataclass(frozen=True)
class DeepSpeedConfig(Section):
    """``deepspeed_config``: settings handed to workers that wrap models with DeepSpeed."""

    deepspeed_config_file: str | None = _opt(parse_str, "path of a DeepSpeed JSON config")
    zero_stage: int | None = _opt(int_parser(0, 3), "ZeRO stage (0-3)")
    offload_optimizer_device: str | None = _opt(
        choice_parser(OFFLOAD_DEVICES, "lower"), "where ZeRO offloads optimizer state"
    )
    offload_param_device: str | None = _opt(
        choice_parser(OFFLOAD_DEVICES, "lower"), "where ZeRO-3 offloads parameters"
    )
    offload_optimizer_nvme_path: str | None = _opt(parse_str, "NVMe path for optimizer offload")
    offload_param_nvme_path: str | None = _opt(parse_str, "NVMe path for parameter offload")
    gradient_accumulation_steps: int | None = _opt(int_parser(1), "micro-steps per optimizer step")
    gradient_clipping: float | None = _opt(float_parser(0.0), "gradient norm clipping value")
    zero3_init_flag: bool | None = _opt(parse_bool, "build huge models sharded (ZeRO-3)")
    zero3_save_16bit_model: bool | None = _opt(parse_bool, "gather a 16-bit model on save (ZeRO-3)")
    deepspeed_hostfile: str | None = _opt(parse_str, "DeepSpeed hostfile (multi-node)")
    deepspeed_inclusion_filter: str | None = _opt(parse_str, "DeepSpeed inclusion filter")
    deepspeed_exclusion_filter: str | None = _opt(parse_str, "DeepSpeed exclusion filter")
    deepspeed_multinode_launcher: str | None = _opt(
        choice_parser(DEEPSPEED_MULTINODE_LAUNCHERS, "lower"),
        "multi-node launcher; accel supports 'standard' (torch elastic on every machine)",
    )
    deepspeed_moe_layer_cls_names: str | None = _opt(parse_csv, "MoE layer classes (comma list)")


@dataclasses.dataclass(frozen=True)
class FsdpConfig(Section):
    """``fsdp_config``: settings handed to workers that wrap models with FSDP."""

    ALIASES: ClassVar[dict[str, str]] = {"fsdp_backward_prefetch_policy": "fsdp_backward_prefetch"}

    fsdp_version: int | None = _opt(int_parser(1, 2), "FSDP API version (1 or 2)")
    fsdp_sharding_strategy: str | None = _opt(_fsdp_sharding_strategy, "how parameters are sharded")
    fsdp_reshard_after_forward: bool | None = _opt(parse_bool, "FSDP2: reshard after forward")
    fsdp_offload_params: bool | None = _opt(parse_bool, "offload parameters and gradients to CPU")
    fsdp_auto_wrap_policy: str | None = _opt(
        choice_parser(FSDP_AUTO_WRAP_POLICIES), "which submodules become FSDP units"
    )
    fsdp_transformer_layer_cls_to_wrap: str | None = _opt(
        parse_csv, "layer class names wrapped by TRANSFORMER_BASED_WRAP (comma list)"
    )
    fsdp_min_num_params: int | None = _opt(int_parser(0), "SIZE_BASED_WRAP parameter threshold")
    fsdp_backward_prefetch: str | None = _opt(
        choice_parser(FSDP_BACKWARD_PREFETCH), "backward prefetch policy"
    )
    fsdp_forward_prefetch: bool | None = _opt(parse_bool, "prefetch the next all-gather forward")
    fsdp_state_dict_type: str | None = _opt(
        choice_parser(FSDP_STATE_DICT_TYPES), "state dict layout for checkpoints"
    )
    fsdp_use_orig_params: bool | None = _opt(parse_bool, "keep original parameters visible")
    fsdp_cpu_ram_efficient_loading: bool | None = _opt(
        parse_bool, "load weights on rank 0 only, then broadcast"
    )
    fsdp_sync_module_states: bool | None = _opt(parse_bool, "broadcast module states from rank 0")
    fsdp_activation_checkpointing: bool | None = _opt(
        parse_bool, "checkpoint FSDP unit activations"
    )
    fsdp_activation_checkpointing_offload: bool | None = _opt(
        parse_bool, "FSDP2: keep checkpointed inputs in pinned CPU memory until backward"
    )


def _degree(key: str, value: Any) -> int:
    """A parallelism degree: an integer >= 1, or -1 (the processes the other degrees leave)."""
    number = int_parser()(key, value)
    if number < 1 and number != -1:
        raise ConfigError(
            "must be >= 1, or -1 to take the leftover processes", key=key, value=value
        )
    return int(number)


@dataclasses.dataclass(frozen=True)
class ParallelismSection(Section):
    """``parallelism_config``: N-D parallelism degrees handed to workers (Accelerate's keys)."""

    parallelism_config_dp_replicate_size: int | None = _opt(
        _degree, "data-parallel replicas (DDP / HSDP replicate dimension)"
    )
    parallelism_config_dp_shard_size: int | None = _opt(
        _degree, "data-parallel ranks parameters are sharded over (FSDP2)"
    )
    parallelism_config_tp_size: int | None = _opt(_degree, "tensor-parallel degree")
    parallelism_config_cp_size: int | None = _opt(_degree, "context-parallel degree (CUDA)")
    parallelism_config_cp_backend: str | None = _opt(
        choice_parser(CP_BACKENDS, "lower"), "context-parallel backend (torch)"
    )
    parallelism_config_cp_comm_strategy: str | None = _opt(
        choice_parser(CP_COMM_STRATEGIES, "lower"), "ring attention exchange: allgather, alltoall"
    )
    parallelism_config_sp_size: int | None = _opt(_degree, "sequence-parallel (Ulysses) degree")
    parallelism_config_sp_backend: str | None = _opt(
        choice_parser(SP_BACKENDS, "lower"), "sequence-parallel backend: deepspeed, accelerate"
    )
    parallelism_config_sp_seq_length: int | None = _opt(int_parser(1), "fixed sequence length")
    parallelism_config_sp_seq_length_is_variable: bool | None = _opt(
        parse_bool, "sequences vary in length"
    )
    parallelism_config_sp_attn_implementation: str | None = _opt(
        parse_str, "attention the Ulysses wrapper calls"
    )

    def settings(self) -> dict[str, Any]:
        """The keys that are set, without the ``parallelism_config_`` prefix (the field names)."""
        return {
            key.removeprefix(PARALLELISM_PREFIX): value for key, value in self.to_dict().items()
        }


def parse_precision_override(key: str, value: Any) -> tuple[bool, bool, bool]:
    """Three booleans (fprop, dgrad, wgrad): a list, or text such as ``"true,false,false"``."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or len(parts) != 3:
        raise ConfigError(
            "must be three booleans (fprop, dgrad, wgrad), e.g. true,false,false",
            key=key,
            value=value,
        )
    fprop, dgrad, wgrad = (parse_bool(key, part) for part in parts)
    return (fprop, dgrad, wgrad)


@dataclasses.dataclass(frozen=True)
class Fp8Config(Section):
    """``fp8_config``: the fp8 recipe handed to workers when ``mixed_precision`` is ``fp8``.

    Accelerate writes the keys without the ``fp8_`` prefix (``backend: AO``, ``margin: 0``,
    ``amax_history_length``...); both spellings are read.
    """

    ALIASES: ClassVar[dict[str, str]] = {
        "fp8_amax_history_length": "fp8_amax_history_len",
        "fp8_amax_compute_algorithm": "fp8_amax_compute_algo",
        "fp8_optimization_level": "fp8_opt_level",
    }

    fp8_backend: str | None = _opt(
        choice_parser(FP8_BACKENDS), "fp8 engine: AO (torchao), TE (TransformerEngine), MSAMP"
    )
    fp8_use_autocast_during_eval: bool | None = _opt(parse_bool, "TE: fp8 autocast in eval mode")
    fp8_margin: int | None = _opt(int_parser(0), "TE: scaling-factor margin")
    fp8_interval: int | None = _opt(int_parser(1), "TE: steps between scaling-factor updates")
    fp8_format: str | None = _opt(choice_parser(FP8_FORMATS), "TE: HYBRID, E4M3 or E5M2")
    fp8_amax_history_len: int | None = _opt(int_parser(1), "TE: length of the amax history")
    fp8_amax_compute_algo: str | None = _opt(
        choice_parser(FP8_AMAX_COMPUTE_ALGOS, "lower"), "TE: max or most_recent"
    )
    fp8_override_linear_precision: tuple[bool, bool, bool] | None = _opt(
        parse_precision_override, "TE: fprop,dgrad,wgrad GEMMs in higher precision"
    )
    fp8_opt_level: str | None = _opt(choice_parser(FP8_OPT_LEVELS), "MS-AMP: O1 or O2")
    fp8_enable_fsdp_float8_all_gather: bool | None = _opt(
        parse_bool, "AO: all-gather fp8 weights in float8 under FSDP2"
    )
    fp8_pad_inner_dim: bool | None = _opt(parse_bool, "AO: pad matmul dimensions to 16")

    @classmethod
    def _normalise(cls, data: Mapping[str, Any], namer: KeyNamer) -> Mapping[str, Any]:
        """Give Accelerate's unprefixed keys (``backend``, ``margin``...) the ``fp8_`` prefix."""
        return {
            (str(key) if str(key).startswith("fp8_") else f"fp8_{key}"): value
            for key, value in data.items()
        }

    def recipe_fields(self) -> dict[str, Any]:
        """The set keys as recipe field names (``fp8_margin`` -> ``margin``), backend left out."""
        fields: dict[str, Any] = {}
        for key, value in self.to_dict().items():
            if key == "fp8_backend":
                continue
            name = key if key == "fp8_format" else key.removeprefix("fp8_")
            fields[name] = list(value) if isinstance(value, tuple) else value
        return fields


@dataclasses.dataclass(frozen=True)
class AccelConfig(Section):
    """A whole config file (Accelerate's format) or the same keys gathered from flags."""

    compute_environment: str | None = _opt(
        choice_parser(ComputeEnvironment.list()), "where the job runs (LOCAL_MACHINE)"
    )
    distributed_type: str | None = _opt(
        choice_parser(DISTRIBUTED_TYPES, aliases={"TPU": DistributedType.XLA.value}),
        "NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, XLA (TPU), DEEPSPEED or FSDP",
    )
    mixed_precision: str | None = _opt(
        choice_parser(PrecisionType.list(), "lower"), "no, fp16, bf16 or fp8"
    )
    use_cpu: bool | None = _opt(parse_bool, "run on the CPU even when an accelerator exists")
    debug: bool | None = _opt(parse_bool, "check collectives across ranks before running them")
    num_processes: int | None = _opt(int_parser(1), "processes in total, across all machines")
    num_machines: int | None = _opt(int_parser(1), "machines taking part (the most, if elastic)")
    min_num_machines: int | None = _opt(
        int_parser(1), "elastic jobs (c10d): fewest machines the job runs or continues on"
    )
    machine_rank: int | None = _opt(int_parser(0), "index of this machine (0 hosts the store)")
    gpu_ids: str | None = _opt(parse_csv, "GPU ids to use on this machine, or 'all'")
    main_process_ip: str | None = _opt(parse_str, "address of machine 0")
    main_process_port: int | None = _opt(int_parser(1, 65535), "rendezvous port on machine 0")
    rdzv_backend: str | None = _opt(choice_parser(RDZV_BACKENDS, "lower"), "static or c10d")
    rdzv_conf: str | None = _opt(parse_str, "extra rendezvous settings, key1=value1,key2=value2")
    same_network: bool | None = _opt(parse_bool, "machines share a local network")
    main_training_function: str | None = _opt(parse_str, "function the XLA launcher calls")
    downcast_bf16: bool | None = _opt(parse_bool, "on XLA, store float32 as bfloat16")
    enable_cpu_affinity: bool | None = _opt(
        parse_bool, "pin each worker to the cores of its NUMA node (set_numa_affinity)"
    )
    gradient_accumulation_steps: int | None = _opt(int_parser(1), "micro-steps per optimizer step")
    num_cpu_threads_per_process: int | None = _opt(int_parser(1), "OMP_NUM_THREADS per worker")
    max_restarts: int | None = _opt(int_parser(0), "times the whole group may be restarted")
    collective_timeout: float | None = _opt(
        float_parser(0.0, exclusive=True), "seconds a collective may wait before workers raise"
    )
    monitor_interval: float | None = _opt(
        float_parser(0.0, exclusive=True), "seconds between health checks of the workers"
    )
    dynamo_config: DynamoConfig = dataclasses.field(
        default_factory=DynamoConfig,
        metadata={"section": DynamoConfig, "doc": "torch.compile settings"},
    )
    deepspeed_config: DeepSpeedConfig = dataclasses.field(
        default_factory=DeepSpeedConfig,
        metadata={"section": DeepSpeedConfig, "doc": "DeepSpeed settings"},
    )
    fsdp_config: FsdpConfig = dataclasses.field(
        default_factory=FsdpConfig, metadata={"section": FsdpConfig, "doc": "FSDP settings"}
    )
    mpirun_config: MpirunConfig = dataclasses.field(
        default_factory=MpirunConfig,
        metadata={"section": MpirunConfig, "doc": "machines of a multi-CPU job (hostfile)"},
    )
    use_parallelism_config: bool | None = _opt(
        parse_bool, "build a ParallelismConfig (device mesh) in the workers"
    )
    parallelism_config: ParallelismSection = dataclasses.field(
        default_factory=ParallelismSection,
        metadata={"section": ParallelismSection, "doc": "N-D parallelism degrees"},
    )
    fp8_config: Fp8Config = dataclasses.field(
        default_factory=Fp8Config,
        metadata={"section": Fp8Config, "doc": "fp8 recipe (with mixed_precision fp8)"},
    )

    @classmethod
    def _normalise(cls, data: Mapping[str, Any], namer: KeyNamer) -> Mapping[str, Any]:
        """Move the old top-level ``dynamo_backend`` key into ``dynamo_config``."""
        if "dynamo_backend" not in data:
            return data
        moved = {key: value for key, value in data.items() if key != "dynamo_backend"}
        nested = dict(_as_mapping(namer("dynamo_config"), moved.get("dynamo_config")))
        nested.setdefault("dynamo_backend", data["dynamo_backend"])
        moved["dynamo_config"] = nested
        return moved

    @classmethod
    def _skip_unknown(cls, key: str, value: Any, namer: KeyNamer, notes: list[str]) -> bool:
        if key not in IGNORED_KEYS:
            return False
        if value not in (None, False, "", [], {}):
            notes.append(f"key {namer(key)!r} is not supported by accel and is ignored")
        return True


__all__ = [
    "CP_BACKENDS",
    "CP_COMM_STRATEGIES",
    "DISTRIBUTED_TYPES",
    "DYNAMO_BACKENDS",
    "DYNAMO_MODES",
    "FSDP_AUTO_WRAP_POLICIES",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGIES",
    "FP8_AMAX_COMPUTE_ALGOS",
    "FP8_BACKENDS",
    "FP8_FORMATS",
    "FP8_OPT_LEVELS",
    "FSDP_STATE_DICT_TYPES",
    "IGNORED_KEYS",
    "OFFLOAD_DEVICES",
    "RDZV_BACKENDS",
    "SP_BACKENDS",
    "AccelConfig",
    "MpirunConfig",
    "DeepSpeedConfig",
    "DynamoConfig",
    "Fp8Config",
    "FsdpConfig",
    "ParallelismSection",
    "Section",
    "file_key",
    "flag_key",
]
