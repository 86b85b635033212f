"""The ``accel launch`` command line: Accelerate's flag names and meanings, nothing imported but argparse.

Every flag that takes a value defaults to ``None`` so that :mod:`accel_launch.plan` can tell a flag
the user typed from a value the config file provides: flags win, then the file, then defaults. A
switch (``--cpu``, ``--multi_gpu``, ``--debug``...) defaults to ``False``, as in Accelerate; since a
switch can only be typed to turn it on, ``False`` means "not typed" (:func:`switch_names`).
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from accel_launch.config.fields import BOOL_SPELLINGS, parse_bool
from accel_launch.config.schema import (
    CP_BACKENDS,
    CP_COMM_STRATEGIES,
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    FP8_AMAX_COMPUTE_ALGOS,
    FP8_FORMATS,
    FP8_OPT_LEVELS,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FSDP_STATE_DICT_TYPES,
    OFFLOAD_DEVICES,
    RDZV_BACKENDS,
    SP_BACKENDS,
)
from accel_launch.errors import ConfigError
from accel_launch.spellings import add_hyphenated_spellings

DESCRIPTION = (
    "Run a Python script (or module, or program) on one or many processes and machines. Any torch "
    "script works: workers get torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR...) plus accel's "
    "settings. Flags override the config file (see `accel config`). Every multi-word flag may be "
    "spelled with hyphens too (--num-processes for --num_processes)."
)


#: Accelerate's ``--megatron_lm_*`` launch flags: accepted by the parser, refused at launch.
MEGATRON_LM_FLAGS = tuple(
    f"megatron_lm_{name}"
    for name in (
        "tp_degree",
        "use_custom_fsdp",
        "no_load_optim",
        "eod_mask_loss",
        "overlap_cpu_optimizer_d2h_h2d",
        "no_save_optim",
        "optimizer_cpu_offload",
        "use_precision_aware_optimizer",
        "decoder_last_pipeline_num_layers",
        "pp_degree",
        "num_micro_batches",
        "sequence_parallelism",
        "recompute_activations",
        "use_distributed_optimizer",
        "gradient_clipping",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "attention_backend",
        "expert_model_parallel_size",
        "context_parallel_size",
        "attention_dropout",
        "hidden_dropout",
        "attention_softmax_in_fp32",
        "expert_tensor_parallel_size",
        "calculate_per_token_loss",
        "use_rotary_position_embeddings",
    )
)


def _bool_arg(text: str) -> bool:
    try:
        return parse_bool("value", text)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a boolean; use one of {', '.join(BOOL_SPELLINGS)}"
        ) from None


def _upper(text: str) -> str:
    return text.strip().upper()


def _lower(text: str) -> str:
    return text.strip().lower()


def _add(group: Any, *names: str, **kwargs: Any) -> None:
    kwargs.setdefault("default", False if kwargs.get("action") == "store_true" else None)
    group.add_argument(*names, **kwargs)


@functools.cache
def switch_names() -> frozenset[str]:
    """The destinations of ``accel launch``'s on/off switches (``False`` there means not typed)."""
    return frozenset(
        action.dest
        for action in build_launch_parser()._actions
        if isinstance(action, argparse._StoreTrueAction)
    )


def typed_value(args: argparse.Namespace, name: str) -> Any:
    """``args.name`` when the user gave it, else ``None`` (an unset switch counts as not given)."""
    value = getattr(args, name, None)
    if value is False and name in switch_names():
        return None
    return value


def parse_machine_count(text: str) -> tuple[int | None, int]:
    """``"3"`` -> ``(None, 3)``; torchrun's ``"2:3"`` -> ``(2, 3)`` (fewest, most machines).

    Raises:
        argparse.ArgumentTypeError: Not ``N`` or ``MIN:MAX`` with ``1 <= MIN <= MAX``.
    """
    low, sep, high = text.strip().partition(":")
    parts = [low, high] if sep else [low]
    if not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a machine count: write N (e.g. 2) or an elastic range MIN:MAX "
            "(e.g. 2:3, as torchrun's --nnodes)"
        )
    numbers = [int(part) for part in parts]
    if min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: machine counts start at 1")
    if not sep:
        return None, numbers[0]
    if numbers[0] > numbers[1]:
        raise argparse.ArgumentTypeError(
            f"{text!r}: MIN ({numbers[0]}) is above MAX ({numbers[1]}); write "
            f"{numbers[1]}:{numbers[0]}"
        )
    return numbers[0], numbers[1]


class _MachineCountAction(argparse.Action):
    """``--num_machines N`` or ``MIN:MAX``: sets ``num_machines`` (MAX) and ``min_num_machines``.

    ``N`` sets both to ``N``, so a typed fixed count replaces a range from the config file.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        try:
            fewest, most = parse_machine_count(str(values))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        namespace.num_machines = most
        # A typed fixed count also replaces a range from the config file.
        namespace.min_num_machines = most if fewest is None else fewest


def _bool_flag(group: Any, name: str, help_text: str) -> None:
    """A flag taking an explicit value, as Accelerate's ``--fsdp_offload_params true``."""
    _add(group, name, type=_bool_arg, metavar="{true,false}", help=help_text)


def add_launch_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every ``accel launch`` flag and the positional script arguments to ``parser``.

    Every multi-word flag is accepted with hyphens too (``--num-processes``), as in Accelerate.
    """
    parser.add_argument(
        "--config_file",
        default=None,
        help="Config file to read (default: $HF_HOME/accel/default_config.yaml, see `accel config`).",
    )
    _add(
        parser,
        "-q",
        "--quiet",
        action="store_true",
        help="Only print the workers' output and errors (hides the launcher's own messages "
        "and torch elastic's info).",
    )
    _add(
        parser,
        "--as_accelerate",
        action="store_true",
        help=(
            "Serve `import accelerate` with accel in every worker, so that an unmodified script "
            "(or transformers' Trainer, TRL, PEFT) runs on accel. Needs the accel package."
        ),
    )

    hardware = parser.add_argument_group("Hardware selection")
    _add(hardware, "--cpu", action="store_true", help="Train on the CPU even if a GPU is present.")
    _add(hardware, "--multi_gpu", action="store_true", help="Launch a distributed GPU job.")
    _add(hardware, "--tpu", action="store_true", help="Launch through torch_xla's launcher.")

    resources = parser.add_argument_group("Resources")
    _add(
        resources,
        "--mixed_precision",
        type=_lower,
        choices=["no", "fp16", "bf16", "fp8"],
        help="Mixed precision mode handed to the workers.",
    )
    _add(
        resources,
        "--num_processes",
        type=int,
        help="Processes in TOTAL across all machines; each runs num_processes // num_machines, "
        "which must divide evenly.",
    )
    _add(
        resources,
        "--num_machines",
        action=_MachineCountAction,
        metavar="N|MIN:MAX",
        help="Machines taking part (one `accel launch` per machine). MIN:MAX (torchrun's --nnodes "
        "MIN:MAX) makes the job elastic: it starts once MIN machines joined the c10d rendezvous "
        "at --main_process_ip:--main_process_port (MAX at once if they come within the "
        "rendezvous' last_call_timeout), and with --max_restarts a machine lost for good is left "
        "out: the others restart on MIN..MAX-1 machines, and a machine started later is taken in. "
        "Ranks are assigned by the rendezvous (no --machine_rank); --num_processes counts the "
        "processes at MAX machines. Tune detection with --rdzv_conf, e.g. "
        "last_call_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=5,join_timeout=300.",
    )
    parser.set_defaults(min_num_machines=None)
    _add(
        resources,
        "--num_cpu_threads_per_process",
        type=int,
        help="OMP_NUM_THREADS for each worker (default on CPU: cores // local processes).",
    )
    _add(
        resources,
        "--gradient_accumulation_steps",
        type=int,
        help="Micro-steps per optimizer step, handed to the workers.",
    )
    _add(
        resources,
        "--dynamo_backend",
        type=_upper,
        choices=DYNAMO_BACKENDS,
        help="torch.compile backend (NO disables it).",
    )
    _add(resources, "--dynamo_mode", type=_lower, choices=DYNAMO_MODES, help="torch.compile mode.")
    _add(
        resources,
        "--dynamo_use_fullgraph",
        action="store_true",
        help="torch.compile(fullgraph=True).",
    )
    _add(
        resources, "--dynamo_use_dynamic", action="store_true", help="torch.compile(dynamic=True)."
    )
    _add(
        resources,
        "--dynamo_use_regional_compilation",
        action="store_true",
        help="Compile each repeated block once (accel.compile_regions) instead of the whole model.",
    )
    _add(
        resources,
        "--enable_cpu_affinity",
        action="store_true",
        help="Pin each worker to the cores of its NUMA node (on a CPU run: an equal share of them).",
    )

    paradigm = parser.add_argument_group("Training paradigm")
    _add(
        paradigm, "--use_deepspeed", action="store_true", help="Workers wrap models with DeepSpeed."
    )
    _add(paradigm, "--use_fsdp", action="store_true", help="Workers wrap models with FSDP.")

    distributed = parser.add_argument_group("Distributed")
    _add(distributed, "--gpu_ids", help="Comma-separated GPU ids to use on this machine, or 'all'.")
    _add(
        distributed,
        "--same_network",
        action="store_true",
        help="All machines are on one local network (accepted; the endpoint is the same either way).",
    )
    _add(distributed, "--machine_rank", type=int, help="Index of this machine (0 hosts the store).")
    _add(distributed, "--main_process_ip", help="Address of machine 0.")
    _add(
        distributed,
        "--main_process_port",
        type=int,
        help="Rendezvous port on machine 0 (one machine: a free port is picked when not given).",
    )
    _add(
        distributed,
        "-t",
        "--tee",
        help="Tee worker streams to log files and console: 0-3 or rank:std,...",
    )
    _add(distributed, "--log_dir", help="Folder for worker logs (with --tee) and error files.")
    _add(distributed, "--role", help="Worker role name shown by torch elastic.")
    _add(
        distributed,
        "--rdzv_backend",
        type=_lower,
        choices=RDZV_BACKENDS,
        help="Rendezvous backend.",
    )
    _add(distributed, "--rdzv_conf", help="Extra rendezvous settings: key1=value1,key2=value2.")
    _add(distributed, "--max_restarts", type=int, help="Times a failed group may be restarted.")
    fault_tolerance = parser.add_argument_group(
        "Fault tolerance across replica groups (torchft; pip install 'accel-launch[ft]')"
    )
    _add(
        fault_tolerance,
        "--ft_replicas",
        type=int,
        metavar="N",
        help="Run N replica groups of --num_processes processes each on this machine, with a "
        "torchft lighthouse: a failed group is relaunched (up to --max_restarts times) while the "
        "others keep training.",
    )
    _add(
        fault_tolerance,
        "--ft_min_replicas",
        type=int,
        metavar="K",
        help="Fewest replica groups a step commits with (default 1).",
    )
    _add(
        fault_tolerance,
        "--ft_lighthouse",
        metavar="HOST:PORT",
        help="Join the lighthouse at HOST:PORT instead of starting one (one group per launcher, "
        "for groups on several machines); needs --ft_replica_id.",
    )
    _add(
        fault_tolerance,
        "--ft_replica_id",
        type=int,
        metavar="I",
        help="Which replica group this launcher runs (with --ft_lighthouse).",
    )
    _add(
        distributed,
        "--collective_timeout",
        type=float,
        metavar="SECONDS",
        help="Seconds a collective may wait before every worker raises, naming where it waits "
        "(default: 600 until the first training step, 300 after it).",
    )
    _add(
        distributed, "--monitor_interval", type=float, help="Seconds between worker health checks."
    )
    _add(
        distributed,
        "--mpirun_hostfile",
        "--hostfile",
        dest="mpirun_hostfile",
        help="Hostfile listing the machines ('host slots=N' per line): sets the machine count, "
        "machine 0's address, this machine's rank and the processes per machine.",
    )
    _add(
        distributed,
        "--env",
        action="append",
        metavar="KEY=VALUE",
        help="Environment variable for every worker; repeat for several.",
    )
    _add(
        distributed,
        "-m",
        "--module",
        action="store_true",
        help="Run the target as a module (python -m), not a file.",
    )
    _add(
        distributed,
        "--no_python",
        action="store_true",
        help="Run the target as a program, without prefixing it with the Python interpreter.",
    )

    tpu = parser.add_argument_group("TPU / XLA")
    _add(
        tpu,
        "--main_training_function",
        help="Function of the script the XLA launcher calls (main).",
    )
    _add(
        tpu,
        "--downcast_bf16",
        action="store_true",
        help="With --tpu and --mixed_precision bf16: compute float32 as bfloat16 and float64 as "
        "float32 (torch_xla's XLA_DOWNCAST_BF16). Refused on other launches.",
    )

    deepspeed = parser.add_argument_group("DeepSpeed (with --use_deepspeed)")
    _add(deepspeed, "--deepspeed_config_file", help="DeepSpeed JSON config file.")
    _add(deepspeed, "--zero_stage", type=int, choices=[0, 1, 2, 3], help="ZeRO stage.")
    _add(
        deepspeed,
        "--offload_optimizer_device",
        type=_lower,
        choices=OFFLOAD_DEVICES,
        help="Optimizer offload.",
    )
    _add(
        deepspeed,
        "--offload_param_device",
        type=_lower,
        choices=OFFLOAD_DEVICES,
        help="Parameter offload.",
    )
    _add(deepspeed, "--offload_optimizer_nvme_path", help="NVMe path for optimizer offload.")
    _add(deepspeed, "--offload_param_nvme_path", help="NVMe path for parameter offload.")
    _add(deepspeed, "--gradient_clipping", type=float, help="Gradient norm clipping value.")
    _bool_flag(deepspeed, "--zero3_init_flag", "Build huge models sharded (ZeRO-3).")
    _bool_flag(deepspeed, "--zero3_save_16bit_model", "Gather a 16-bit model when saving (ZeRO-3).")
    _add(deepspeed, "--deepspeed_hostfile", help="DeepSpeed hostfile.")
    _add(deepspeed, "--deepspeed_inclusion_filter", help="DeepSpeed inclusion filter.")
    _add(deepspeed, "--deepspeed_exclusion_filter", help="DeepSpeed exclusion filter.")
    _add(
        deepspeed,
        "--deepspeed_multinode_launcher",
        type=_lower,
        choices=DEEPSPEED_MULTINODE_LAUNCHERS,
        help="Multi-node launcher; accel runs 'standard' (torch elastic on every machine).",
    )
    _add(
        deepspeed, "--deepspeed_moe_layer_cls_names", help="MoE layer class names, comma-separated."
    )

    fsdp = parser.add_argument_group("FSDP (with --use_fsdp)")
    _add(fsdp, "--fsdp_version", type=int, choices=[1, 2], help="FSDP API version.")
    _add(
        fsdp,
        "--fsdp_sharding_strategy",
        type=_upper,
        choices=FSDP_SHARDING_STRATEGIES,
        help="Sharding.",
    )
    _bool_flag(fsdp, "--fsdp_reshard_after_forward", "FSDP2: reshard parameters after forward.")
    _bool_flag(fsdp, "--fsdp_offload_params", "Offload parameters and gradients to CPU.")
    _add(
        fsdp,
        "--fsdp_auto_wrap_policy",
        type=_upper,
        choices=FSDP_AUTO_WRAP_POLICIES,
        help="Wrapping.",
    )
    _add(
        fsdp, "--fsdp_transformer_layer_cls_to_wrap", help="Layer classes to wrap, comma-separated."
    )
    _add(fsdp, "--fsdp_min_num_params", type=int, help="SIZE_BASED_WRAP parameter threshold.")
    _add(
        fsdp,
        "--fsdp_backward_prefetch",
        "--fsdp_backward_prefetch_policy",
        dest="fsdp_backward_prefetch",
        type=_upper,
        choices=FSDP_BACKWARD_PREFETCH,
        help="Backward prefetch policy.",
    )
    _bool_flag(fsdp, "--fsdp_forward_prefetch", "Prefetch the next all-gather in forward.")
    _add(
        fsdp,
        "--fsdp_state_dict_type",
        type=_upper,
        choices=FSDP_STATE_DICT_TYPES,
        help="Checkpoint layout.",
    )
    _bool_flag(fsdp, "--fsdp_use_orig_params", "Keep the original parameters visible.")
    _bool_flag(
        fsdp,
        "--fsdp_cpu_ram_efficient_loading",
        "Load the full weights on local rank 0 only (transformers' from_pretrained); the other "
        "ranks get rank 0's when the model is prepared (needs --fsdp_sync_module_states true).",
    )
    _bool_flag(fsdp, "--fsdp_sync_module_states", "Broadcast module states from rank 0.")
    _bool_flag(fsdp, "--fsdp_activation_checkpointing", "Checkpoint activations of FSDP units.")
    _bool_flag(
        fsdp,
        "--fsdp_activation_checkpointing_offload",
        "FSDP2: keep the checkpointed inputs in pinned CPU memory until backward "
        "(needs --fsdp_activation_checkpointing true).",
    )

    nd = parser.add_argument_group("N-D parallelism (with --use_parallelism_config)")
    _add(
        nd,
        "--use_parallelism_config",
        action="store_true",
        help="Workers build a ParallelismConfig device mesh from the sizes below.",
    )
    for dim, meaning in (
        ("dp_replicate", "data-parallel replicas (DDP, or HSDP's replicate dimension)"),
        ("dp_shard", "data-parallel ranks parameters are sharded over (FSDP2)"),
        ("tp", "tensor-parallel degree"),
        ("cp", "context-parallel degree (CUDA)"),
        ("sp", "sequence-parallel degree (not supported by accel's Accelerator)"),
    ):
        _add(
            nd,
            f"--parallelism_config_{dim}_size",
            type=int,
            help=f"Size of the {dim} dimension: {meaning}; -1 takes the leftover processes.",
        )
    _add(
        nd,
        "--parallelism_config_cp_backend",
        type=_lower,
        choices=CP_BACKENDS,
        help="Context-parallel backend.",
    )
    _add(
        nd,
        "--parallelism_config_cp_comm_strategy",
        type=_lower,
        choices=CP_COMM_STRATEGIES,
        help="How ring attention exchanges keys and values.",
    )
    _add(
        nd,
        "--parallelism_config_sp_backend",
        type=_lower,
        choices=SP_BACKENDS,
        help="Sequence-parallel backend.",
    )
    _add(nd, "--parallelism_config_sp_seq_length", type=int, help="Fixed sequence length (SP).")
    _bool_flag(
        nd, "--parallelism_config_sp_seq_length_is_variable", "Sequences vary in length (SP)."
    )
    _add(nd, "--parallelism_config_sp_attn_implementation", help="Attention SP wraps.")
    fp8 = parser.add_argument_group("FP8 (with --mixed_precision fp8)")
    _add(
        fp8,
        "--fp8_backend",
        type=_upper,
        choices=["AO", "TE", "MSAMP"],
        help="fp8 engine: ao (torchao, runs on the CPU too), te (TransformerEngine), msamp.",
    )
    _add(
        fp8,
        "--fp8_use_autocast_during_eval",
        action="store_true",
        help="TE: keep fp8 autocast on in eval mode.",
    )
    _add(fp8, "--fp8_margin", type=int, help="TE: scaling-factor margin.")
    _add(fp8, "--fp8_interval", type=int, help="TE: steps between scaling-factor updates.")
    _add(fp8, "--fp8_format", type=_upper, choices=FP8_FORMATS, help="TE: fp8 format.")
    _add(fp8, "--fp8_amax_history_len", type=int, help="TE: length of the amax history.")
    _add(
        fp8,
        "--fp8_amax_compute_algo",
        type=_lower,
        choices=FP8_AMAX_COMPUTE_ALGOS,
        help="TE: how the scale is computed from the amax history.",
    )
    _add(
        fp8,
        "--fp8_override_linear_precision",
        help="TE: fprop,dgrad,wgrad GEMMs in higher precision, e.g. false,false,true.",
    )
    _add(fp8, "--fp8_opt_level", type=_upper, choices=FP8_OPT_LEVELS, help="MS-AMP level.")
    _bool_flag(
        fp8,
        "--fp8_enable_fsdp_float8_all_gather",
        "AO: under FSDP2, all-gather fp8 weights in float8 (default true).",
    )
    _bool_flag(fp8, "--fp8_pad_inner_dim", "AO: pad matmul dimensions to 16 (default true).")

    # Accelerate's Megatron-LM flags parse (so a command line written for Accelerate gets a clear
    # refusal instead of "unrecognized arguments") and are refused by flags_to_config; hidden.
    megatron = parser.add_argument_group("Megatron-LM (not supported by accel)")
    _add(megatron, "--use_megatron_lm", action="store_true", help=argparse.SUPPRESS)
    for name in MEGATRON_LM_FLAGS:
        _add(megatron, f"--{name}", metavar="VALUE", help=argparse.SUPPRESS)

    other = parser.add_argument_group("Other")
    _add(
        other, "--debug", action="store_true", help="Workers check collectives across ranks first."
    )

    parser.add_argument(
        "training_script",
        help="The script (or module with -m, or program with --no_python) to run.",
    )
    parser.add_argument(
        "training_script_args",
        nargs=argparse.REMAINDER,
        help="Arguments passed to the script unchanged.",
    )
    return add_hyphenated_spellings(parser)


def build_launch_parser(prog: str = "accel launch") -> argparse.ArgumentParser:
    """A standalone parser for ``accel launch`` / ``accel-launch``."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, allow_abbrev=False)
    return add_launch_arguments(parser)
