"""Decide how to launch: merge flags over the config file, apply defaults, check the combination.

The result is a :class:`LaunchPlan`, a plain value the runners in :mod:`accel_launch.runners`
execute. Nothing here imports torch.

How a job is run:

* ``xla``: ``--tpu`` or ``distributed_type: XLA``; torch_xla's launcher calls
  ``main_training_function`` of the script in every process.
* ``single``: one process on one machine, no distributed mode, no restarts. The script runs as
  ``python script.py`` would, with the accel settings in its environment and *no* torchrun
  variables (``RANK``...), so a plain script behaves exactly as when run by hand.
* ``elastic``: everything else, through PyTorch's elastic agent (what ``torchrun`` uses).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from accel_launch.affinity import CPU_AFFINITY_ENV
from accel_launch.config.schema import AccelConfig
from accel_launch.errors import LaunchArgumentError, LaunchTorchFeatureError
from accel_launch.hardware import cpu_count, parse_gpu_ids, visible_gpu_count
from accel_launch.hostfile import read_hostfile, this_machine_rank
from accel_launch.overlay import flags_to_config
from accel_launch.replica_plan import ReplicaGroups, lighthouse_host, replica_groups
from accel_launch.torchrun_env import torchrun_env_config
from accel_state.contract import AS_ACCELERATE, FT_ADDRESS, LaunchContract
from accel_state.errors import EnvironmentConfigError, ParallelismConfigError
from accel_state.network import RouteChoice, choose_interface, local_address
from accel_state.types import ComputeEnvironment, DistributedType, PrecisionType

DEFAULT_PORT = 29500
_FAILURE_RECORDER = Path(__file__).resolve().parent / "_failure_recorder.py"
SINGLE, ELASTIC, XLA = "single", "elastic", "xla"


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything a runner needs, resolved.

    Attributes:
        mode: ``"single"``, ``"elastic"`` or ``"xla"`` (see the module docstring).
        target: Script path, module name (``module``) or program (``no_python``).
        target_args: Arguments for the target.
        num_processes: Processes in total (``None`` on XLA: every local device).
        nproc_per_node: Processes on this machine.
        num_machines: Machines taking part; with :attr:`min_machines` below it, the most.
        min_machines: Fewest machines an elastic job (``--num_machines MIN:MAX``, c10d) runs or
            continues on; ``None`` when the count is fixed.
        rdzv_endpoint: ``host:port`` of the rendezvous (port 0: picked at start).
        uses_gpus: Whether the workers run on GPUs (then NCCL: torch's Flight Recorder is on).
        interface: The network interface chosen for the backends (several machines, or a
            replica group joining a lighthouse elsewhere; none set by the user): the one that
            routes to the main machine, or to the lighthouse.
        local_addr: This machine's address as the rendezvous publishes it (several machines).
        fault_tolerance: The replica groups to run (``--ft_*`` flags); ``None``: one job.
        env: Variables added to the workers' environment (contract, threads, GPU selection).
        notes: Lines to show the user before starting (defaults used, ignored flags).
    """

    mode: str
    target: str
    target_args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    num_processes: int | None = 1
    num_machines: int = 1
    min_machines: int | None = None
    machine_rank: int = 0
    nproc_per_node: int = 1
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: dict[str, str | int] = dataclasses.field(default_factory=dict)
    run_id: str = "none"
    max_restarts: int = 0
    monitor_interval: float = 0.1
    tee: str | None = None
    log_dir: str | None = None
    role: str = "default"
    quiet: bool = False
    main_training_function: str = "main"
    use_cpu: bool = False
    uses_gpus: bool = False
    contract: LaunchContract = dataclasses.field(default_factory=LaunchContract)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    interface: RouteChoice | None = None
    local_addr: str | None = None
    fault_tolerance: ReplicaGroups | None = None

    @property
    def min_nodes(self) -> int:
        """The ``min_nodes`` of torch elastic: :attr:`min_machines`, or the fixed machine count."""
        return self.num_machines if self.min_machines is None else self.min_machines

    def python_command(self, record_failures: bool = False) -> list[str]:
        """The command one worker runs: ``python -u script.py args`` (or ``-m``, or the program).

        Args:
            record_failures: Run the script through ``_failure_recorder.py``, which writes torch
                elastic's error file (traceback and exact time) when the script raises.
        """
        if self.no_python:
            return [self.target, *self.target_args]
        module = ["-m"] if self.module else []
        recorder = [str(_FAILURE_RECORDER)] if record_failures else []
        return [sys.executable, "-u", *recorder, *module, self.target, *self.target_args]


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """The command-line settings a config file cannot hold, read from the flags once.

    Built where the flags are merged over the config file (:func:`build_plan`); after that the
    plan reads the merged config, the typed flags (:func:`~accel_launch.overlay.flags_to_config`)
    and these options, never the namespace again. Values are as typed (``None``: not given).

    Attributes:
        target: The training script, module (``module``) or program (``no_python``); ``None``
            when only the environment is wanted (launch helpers).
        target_args: Arguments for the target.
        module: ``-m``: run the target as a module.
        no_python: ``--no_python``: run the target as a program.
        tee: ``--tee``: worker streams teed to log files.
        log_dir: ``--log_dir``: folder for worker logs and error files.
        role: ``--role``: worker role name for torch elastic.
        quiet: ``--quiet``: hide the launcher's own messages.
        as_accelerate: ``--as_accelerate``: serve ``import accelerate`` with accel.
        env: ``--env KEY=VALUE`` items, unparsed (see :func:`parse_env_assignments`).
        ft_replicas: ``--ft_replicas``: replica groups to run here.
        ft_min_replicas: ``--ft_min_replicas``: fewest groups a step commits with.
        ft_lighthouse: ``--ft_lighthouse``: ``HOST:PORT`` of a lighthouse elsewhere.
        ft_replica_id: ``--ft_replica_id``: the replica group this launcher runs.
    """

    target: str | None = None
    target_args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    tee: str | None = None
    log_dir: str | None = None
    role: str | None = None
    quiet: bool = False
    as_accelerate: bool = False
    env: tuple[str, ...] = ()
    ft_replicas: int | None = None
    ft_min_replicas: int | None = None
    ft_lighthouse: str | None = None
    ft_replica_id: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchOptions:
        """Read the options from ``accel launch``'s parsed flags (a missing one: not given)."""
        return cls(
            target=getattr(args, "training_script", None),
            target_args=tuple(getattr(args, "training_script_args", None) or ()),
            module=bool(getattr(args, "module", False)),
            no_python=bool(getattr(args, "no_python", False)),
            tee=getattr(args, "tee", None),
            log_dir=getattr(args, "log_dir", None),
            role=getattr(args, "role", None),
            quiet=bool(getattr(args, "quiet", False)),
            as_accelerate=bool(getattr(args, "as_accelerate", False)),
            env=tuple(getattr(args, "env", None) or ()),
            ft_replicas=getattr(args, "ft_replicas", None),
            ft_min_replicas=getattr(args, "ft_min_replicas", None),
            ft_lighthouse=getattr(args, "ft_lighthouse", None),
            ft_replica_id=getattr(args, "ft_replica_id", None),
        )


def parse_rdzv_conf(text: str | None) -> dict[str, str | int]:
    """``"timeout=60,join_timeout=30"`` -> ``{"timeout": 60, "join_timeout": 30}`` (digits as ints).

    Raises:
        LaunchArgumentError: A part is not ``key=value``.
    """
    if not text:
        return {}
    pairs: dict[str, str | int] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise LaunchArgumentError(
                f"--rdzv_conf={text!r}: {part!r} is not key=value; write e.g. "
                "--rdzv_conf timeout=60,read_timeout=30"
            )
        value = value.strip()
        pairs[key.strip()] = int(value) if value.isdigit() else value
    return pairs


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _distributed_type(config: AccelConfig) -> DistributedType | None:
    if config.distributed_type is None:
        return None
    kind = DistributedType(config.distributed_type)
    if kind is DistributedType.MEGATRON_LM:
        raise LaunchArgumentError(
            "distributed_type MEGATRON_LM is not supported by accel; use FSDP or DEEPSPEED."
        )
    return kind


def _check_target(options: LaunchOptions) -> None:
    if options.target is None:
        # A namespace built for a launch helper that only wants the environment
        # (prepare_multi_gpu_env): there is no script to check.
        return
    if options.module and options.no_python:
        raise LaunchArgumentError("--module (-m) and --no_python cannot be combined.")
    if not options.module and not options.no_python and not Path(options.target).is_file():
        raise LaunchArgumentError(
            f"training script {options.target!r} does not exist "
            "(use -m for a module, --no_python for a program)."
        )


def _contract(config: AccelConfig, kind: DistributedType | None, use_cpu: bool) -> LaunchContract:
    dynamo = config.dynamo_config
    deepspeed = config.deepspeed_config.to_dict()
    steps = config.gradient_accumulation_steps or deepspeed.get("gradient_accumulation_steps") or 1
    if kind is DistributedType.DEEPSPEED:
        deepspeed["gradient_accumulation_steps"] = steps
    fp8 = config.fp8_config
    fp8_on = config.mixed_precision == PrecisionType.FP8.value
    try:
        return LaunchContract(
            mixed_precision=PrecisionType(config.mixed_precision or "no"),
            use_cpu=use_cpu,
            gradient_accumulation_steps=steps,
            debug=bool(config.debug),
            dynamo_backend=(dynamo.dynamo_backend or "NO").lower(),
            dynamo_mode=dynamo.dynamo_mode,
            dynamo_use_fullgraph=bool(dynamo.dynamo_use_fullgraph),
            dynamo_use_dynamic=dynamo.dynamo_use_dynamic,
            dynamo_use_regional_compilation=bool(dynamo.dynamo_use_regional_compilation),
            use_deepspeed=kind is DistributedType.DEEPSPEED,
            deepspeed_config=deepspeed if kind is DistributedType.DEEPSPEED else {},
            use_fsdp=kind is DistributedType.FSDP,
            fsdp_config=config.fsdp_config.to_dict() if kind is DistributedType.FSDP else {},
            downcast_bf16=bool(config.downcast_bf16),
            use_parallelism_config=_uses_parallelism_config(config),
            parallelism_config={
                key: _text(value) for key, value in config.parallelism_config.settings().items()
            },
            fp8_backend=fp8.fp8_backend if fp8_on else None,
            fp8_config=fp8.recipe_fields() if fp8_on else {},
            process_group_timeout=config.collective_timeout,
        )
    except EnvironmentConfigError as error:
        raise LaunchArgumentError(str(error)) from None


def _uses_parallelism_config(config: AccelConfig) -> bool:
    """``--use_parallelism_config``, or any ``parallelism_config`` setting (flag or file key)."""
    return bool(config.use_parallelism_config) or bool(config.parallelism_config.settings())


def _text(value: object) -> str:
    """A setting as the text of its ``PARALLELISM_CONFIG_*`` variable (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_parallelism(
    config: AccelConfig, kind: DistributedType | None, num_processes: int | None
) -> None:
    """Refuse, before anything starts, degrees that do not multiply to ``--num_processes``.

    Raises:
        LaunchArgumentError: The product of the degrees is not the number of processes (the
            message prints every factor), or the degrees compose what is refused.
    """
    if not _uses_parallelism_config(config) or num_processes is None:
        return
    from accel_state.parallelism_config import ParallelismConfig

    sizes = {
        key: value
        for key, value in config.parallelism_config.settings().items()
        if key.endswith("_size")
    }
    unset = "dp_shard" if kind is DistributedType.FSDP else "dp_replicate"
    try:
        ParallelismConfig(
            **{
                "dp_replicate_size": 1,
                "dp_shard_size": 1,
                "tp_size": 1,
                "cp_size": 1,
                "sp_size": 1,
                **sizes,
            }
        ).resolve(num_processes, unset_dimension=unset)
    except (ParallelismConfigError, EnvironmentConfigError) as error:
        raise LaunchArgumentError(
            f"--parallelism_config_* sizes do not fit --num_processes {num_processes}: {error}"
        ) from None


def _ignored_section_notes(config: AccelConfig, kind: DistributedType | None) -> list[str]:
    notes = []
    if kind is not DistributedType.DEEPSPEED:
        keys = set(config.deepspeed_config.to_dict()) - {"gradient_accumulation_steps"}
        if keys:
            notes.append(
                f"DeepSpeed settings ({', '.join(sorted(keys))}) have no effect without "
                "--use_deepspeed / distributed_type: DEEPSPEED"
            )
    fp8_keys = config.fp8_config.to_dict()
    if config.mixed_precision != PrecisionType.FP8.value and fp8_keys:
        notes.append(
            f"fp8 settings ({', '.join(sorted(fp8_keys))}) have no effect without "
            "--mixed_precision fp8"
        )
    if kind is not DistributedType.FSDP and config.fsdp_config.to_dict():
        notes.append(
            f"FSDP settings ({', '.join(sorted(config.fsdp_config.to_dict()))}) have no effect "
            "without --use_fsdp / distributed_type: FSDP"
        )
    return notes


def _thread_env(
    config: AccelConfig, mode: str, on_cpu: bool, per_node: int, environ: Mapping[str, str]
) -> dict[str, str]:
    if config.num_cpu_threads_per_process is not None:
        return {"OMP_NUM_THREADS": str(config.num_cpu_threads_per_process)}
    # One process gets the same rule as many (torchrun sets nothing for one process; Accelerate
    # gives a CPU run cores // local processes either way). XLA workers are left to torch_xla.
    if "OMP_NUM_THREADS" in environ or mode == XLA:
        return {}
    if on_cpu:
        return {"OMP_NUM_THREADS": str(max(1, cpu_count() // max(1, per_node)))}
    return {"OMP_NUM_THREADS": "1"} if per_node > 1 else {}


def _intel_openmp_env(use_cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """``--cpu`` launches: Intel OpenMP's thread pinning (``KMP_AFFINITY``) and 1 ms spin wait.

    The values Accelerate sets for a CPU launch; only Intel's and LLVM's OpenMP runtimes read them
    (GNU libgomp ignores them). A value already in the launching environment is kept.
    """
    if not use_cpu:
        return {}
    wanted = {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"}
    return {key: value for key, value in wanted.items() if key not in environ}


def _xla_bf16_env(config: AccelConfig, kind: DistributedType | None, typed: bool) -> dict[str, str]:
    """``--downcast_bf16``: torch_xla's ``XLA_DOWNCAST_BF16`` in the workers of a bf16 XLA job.

    With it torch_xla computes float32 tensors in bfloat16 and float64 in float32 (Accelerate's
    meaning of the flag). It has nothing to act on elsewhere, so a typed flag is refused there.

    Raises:
        LaunchArgumentError: ``--downcast_bf16`` typed for a non-XLA launch or without bf16.
    """
    if not config.downcast_bf16:
        return {}
    if kind is not DistributedType.XLA:
        if typed:
            raise LaunchArgumentError(
                "--downcast_bf16 only applies to XLA launches (--tpu / distributed_type: XLA), "
                "where it sets torch_xla's XLA_DOWNCAST_BF16. For a bf16 run elsewhere use "
                "--mixed_precision bf16 alone."
            )
        return {}
    if config.mixed_precision != "bf16":
        raise LaunchArgumentError(
            f"downcast_bf16 is set but mixed_precision is {config.mixed_precision or 'no'!r}: "
            "downcasting to bfloat16 is a bf16 setting. Add --mixed_precision bf16, or drop "
            "--downcast_bf16 (downcast_bf16: no in the config file)."
        )
    return {"XLA_DOWNCAST_BF16": "1"}


def _mode_notes(
    flags: AccelConfig, options: LaunchOptions, mode: str, num_machines: int
) -> list[str]:
    """Notes for typed flags the chosen launch mode has no use for.

    Args:
        flags: The settings typed on the command line (only those; see ``flags_to_config``).
        options: The command-line settings a config file cannot hold.
        mode: The chosen launch mode.
        num_machines: Machines taking part.
    """
    notes = []
    if mode == SINGLE:
        elastic_only = {
            "tee": options.tee,
            "log_dir": options.log_dir,
            "role": options.role,
            "rdzv_backend": flags.rdzv_backend,
            "rdzv_conf": flags.rdzv_conf,
            "monitor_interval": flags.monitor_interval,
        }
        unused = [name for name, value in elastic_only.items() if value is not None]
        if unused:
            notes.append(
                f"{', '.join('--' + name for name in unused)} only act on multi-process "
                "(torch elastic) launches; this one-process launch runs the script directly "
                "(pass --num_processes 2 or --max_restarts 1 to go through torch elastic)"
            )
    if mode == ELASTIC and num_machines == 1 and flags.rdzv_backend == "static":
        notes.append(
            "--rdzv_backend static is for several machines; one machine always uses a c10d store "
            "on a free port (as torchrun --standalone), so jobs never collide"
        )
    if mode != XLA and flags.main_training_function is not None:
        notes.append(
            "--main_training_function only acts on XLA launches (--tpu); the script runs whole"
        )
    return notes


def _apply_hostfile(config: AccelConfig) -> AccelConfig:
    """Fill machine count, machine 0's address, rank and processes from the hostfile where unset.

    The file is ``mpirun_config.mpirun_hostfile`` (``--mpirun_hostfile`` / ``--hostfile``).

    Raises:
        LaunchArgumentError: The file cannot be read, disagrees with an explicit setting, or
            (several machines) does not list this machine and no ``--machine_rank`` is given.
    """
    path = config.mpirun_config.mpirun_hostfile
    if not path:
        return config
    hosts = read_hostfile(path)
    if config.num_machines is not None and config.num_machines != len(hosts):
        raise LaunchArgumentError(
            f"--num_machines {config.num_machines} but the hostfile {path!r} lists {len(hosts)} "
            "machine(s); drop --num_machines or fix the file."
        )
    changes: dict[str, object] = {"num_machines": len(hosts)}
    if config.main_process_ip is None and len(hosts) > 1:
        changes["main_process_ip"] = hosts[0].name
    if config.machine_rank is None and len(hosts) > 1:
        rank = this_machine_rank(hosts)
        if rank is None:
            raise LaunchArgumentError(
                f"this machine is not listed in the hostfile {path!r} "
                f"({', '.join(host.name for host in hosts)}); pass --machine_rank."
            )
        changes["machine_rank"] = rank
    slots = [host.slots for host in hosts]
    if config.num_processes is None and all(slot is not None for slot in slots):
        if len(set(slots)) > 1:
            raise LaunchArgumentError(
                f"the hostfile {path!r} gives different slots per machine ({slots}); accel runs "
                "the same number of processes on every machine. Make them equal."
            )
        changes["num_processes"] = sum(slot or 0 for slot in slots)
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def parse_env_assignments(items: Sequence[str] | None) -> dict[str, str]:
    """``--env KEY=VALUE`` (repeatable) -> ``{"KEY": "VALUE"}``.

    Raises:
        LaunchArgumentError: An item is not ``KEY=VALUE`` with a valid variable name.
    """
    env: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not (key.replace("_", "a").isalnum() and not key[0].isdigit()):
            raise LaunchArgumentError(
                f"--env {item!r} is not KEY=VALUE with a variable name for KEY; write e.g. "
                "--env WANDB_MODE=offline (repeat --env for several)."
            )
        env[key] = value
    return env


def _feature_env(config: AccelConfig, kind: DistributedType | None) -> dict[str, str]:
    """Variables for ``--enable_cpu_affinity``; checks ``--fsdp_activation_checkpointing_offload``.

    Raises:
        LaunchArgumentError: Activation offload without activation checkpointing or on FSDP1.
    """
    fsdp = config.fsdp_config
    if kind is DistributedType.FSDP and fsdp.fsdp_activation_checkpointing_offload:
        if not fsdp.fsdp_activation_checkpointing:
            raise LaunchArgumentError(
                "fsdp_activation_checkpointing_offload=true offloads the inputs that activation "
                "checkpointing keeps: add --fsdp_activation_checkpointing true."
            )
        if fsdp.fsdp_version == 1:
            raise LaunchArgumentError(
                "fsdp_activation_checkpointing_offload needs FSDP2: pass --fsdp_version 2 "
                "(or drop the offload)."
            )
    return {CPU_AFFINITY_ENV: "1"} if config.enable_cpu_affinity else {}


def _as_accelerate_env(as_accelerate: bool) -> dict[str, str]:
    """``ACCEL_AS_ACCELERATE=1`` for ``--as_accelerate``, once accel is known to be installed.

    The launcher does not import accel (it runs any torch script); accel's start-up hook, which
    the ``accel`` package installs, reads the variable in each worker.

    Raises:
        LaunchArgumentError: ``--as_accelerate`` without the accel package.
    """
    if not as_accelerate:
        return {}
    if importlib.util.find_spec("accel") is None:
        raise LaunchArgumentError(
            "--as_accelerate serves `import accelerate` with accel, but the accel package is not "
            f"installed for {sys.executable}: `pip install accel`, or drop --as_accelerate."
        )
    return {AS_ACCELERATE: "1"}


#: torch's agent computes worker ranks locally (every machine runs the same number of processes
#: of one role) instead of a store exchange after each rendezvous round.
IDENTICAL_WORKERS = "TORCH_ELASTIC_WORKER_IDENTICAL"


def _rendezvous_env(
    mode: str, rdzv_backend: str, max_restarts: int, env: Mapping[str, str]
) -> dict[str, str]:
    """How torch's agents meet after each rendezvous round.

    - Ranks are computed on each machine (``TORCH_ELASTIC_WORKER_IDENTICAL``; the user's own
      setting wins): every machine of an ``accel launch`` job runs the same number of processes
      of one role. torch's other way has the round's rank 0 agent wait in the store for every
      other agent's entry, so a machine that stalls past its keep-alive right after joining a
      round (and so is moved to the next one) left that agent waiting until the store's read
      timeout, and the job failed instead of re-forming.
    - With restarts, every c10d round gets a fresh store. By default torch's c10d rendezvous
      shares one TCP store across rounds and workers do not prefix their keys per attempt, so a
      restarted worker can read the address a dead worker of the previous round published and
      fail to connect. Torch's opt-out makes rank 0 host a new store each round.
    """
    if mode != ELASTIC:
        return {}
    chosen = {} if IDENTICAL_WORKERS in env else {IDENTICAL_WORKERS: "1"}
    if rdzv_backend == "c10d" and max_restarts > 0:
        chosen["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return chosen


def _check_gpus_suffice(
    per_node: int, gpus: int, kind: DistributedType | None, gpu_ids: str | None
) -> None:
    """Refuse, before anything starts, more processes per machine than GPUs on a GPU run.

    Raises:
        LaunchArgumentError: ``per_node`` exceeds the visible GPUs (and there is at least one).
    """
    if gpus == 0 or kind is DistributedType.XLA or per_node <= gpus:
        return
    which = f"--gpu_ids {gpu_ids} selects" if parse_gpu_ids(gpu_ids) else "this machine shows"
    raise LaunchArgumentError(
        f"--num_processes asks for {per_node} process(es) per machine but {which} {gpus} GPU(s), "
        "and each process needs a GPU of its own. Pass --num_processes with at most "
        f"{gpus} per machine, list more GPUs with --gpu_ids, or run on the CPU with --cpu."
    )


def _min_machines(config: AccelConfig, most: int) -> int | None:
    """The fewest machines of an elastic range (``--num_machines MIN:MAX``); ``None``: fixed.

    Raises:
        LaunchArgumentError: ``min_num_machines`` is above ``num_machines`` (config file).
    """
    fewest = config.min_num_machines
    if fewest is None or fewest == most:
        return None
    if fewest > most:
        raise LaunchArgumentError(
            f"min_num_machines {fewest} is above num_machines {most}: an elastic job runs on "
            f"MIN..MAX machines. Pass --num_machines {most}:{fewest} (or fix the config file)."
        )
    return fewest


def _elastic_machine_rank(
    flags: AccelConfig, config: AccelConfig, kind: DistributedType | None, notes: list[str]
) -> int:
    """An elastic range has no machine ranks of its own: the c10d rendezvous assigns them.

    Raises:
        LaunchArgumentError: ``--machine_rank`` was typed, or the job is an XLA one.
    """
    span = f"{config.min_num_machines}:{config.num_machines}"
    if kind is DistributedType.XLA:
        raise LaunchArgumentError(
            f"--num_machines {span} is an elastic range (torch elastic); XLA launches "
            "(--tpu) run a fixed number of machines. Pass --num_machines N."
        )
    if flags.machine_rank is not None:
        raise LaunchArgumentError(
            f"--machine_rank {flags.machine_rank} means nothing with --num_machines {span}: the "
            "c10d rendezvous numbers the machines as they join (and again after one is lost). "
            "Drop --machine_rank, or pass a fixed --num_machines N with it."
        )
    if config.machine_rank:
        notes.append(
            f"machine_rank {config.machine_rank} from the config file is ignored: with "
            f"--num_machines {span} the c10d rendezvous assigns the machine ranks"
        )
    return 0


def _elastic_backend(flags: AccelConfig, config: AccelConfig, notes: list[str]) -> str:
    """An elastic range rendezvouses through c10d (the static rendezvous has fixed ranks).

    Raises:
        LaunchArgumentError: ``--rdzv_backend static`` was typed with a range.
    """
    span = f"{config.min_num_machines}:{config.num_machines}"
    if flags.rdzv_backend == "static":
        raise LaunchArgumentError(
            f"--num_machines {span} needs the c10d rendezvous (machines join and leave; the "
            "static one has a fixed machine count and ranks). Pass --rdzv_backend c10d, or a "
            "fixed --num_machines N."
        )
    if config.rdzv_backend == "static":
        notes.append(
            f"rdzv_backend static from the config file is replaced by c10d: --num_machines {span} "
            "is an elastic range"
        )
    return "c10d"


def build_plan(
    args: argparse.Namespace,
    file_config: AccelConfig | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """Merge ``args`` over ``file_config`` and resolve every launch setting.

    Raises:
        ConfigError: A flag value is invalid.
        LaunchArgumentError: The combination cannot be launched (the message says how to fix it).
    """
    env = os.environ if environ is None else environ
    # The merge reads ``args`` twice, here: what was typed of the config keys (``flags``) and the
    # rest of the command line (``options``). Everything below reads these and ``config`` only.
    flags = flags_to_config(args)
    options = LaunchOptions.from_args(args)
    _check_target(options)
    have_file = file_config is not None
    # torchrun's PET_* variables (Kubeflow) go over the config file; flags go over both.
    pet_config, pet_notes = torchrun_env_config(env)
    config = (file_config or AccelConfig()).merged_with(pet_config).merged_with(flags)
    config = _apply_hostfile(config)
    if config.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER.value:
        raise LaunchArgumentError(
            "compute_environment AMAZON_SAGEMAKER is not supported by accel; use LOCAL_MACHINE."
        )
    kind = _distributed_type(config)
    notes = [*pet_notes, *_ignored_section_notes(config, kind)]
    use_cpu = bool(config.use_cpu) or kind is DistributedType.MULTI_CPU
    num_machines = config.num_machines or 1
    min_machines = _min_machines(config, num_machines)
    machine_rank = config.machine_rank or 0
    if min_machines is not None:
        machine_rank = _elastic_machine_rank(flags, config, kind, notes)
    if machine_rank >= num_machines:
        raise LaunchArgumentError(
            f"--machine_rank {machine_rank} must be below --num_machines {num_machines} "
            f"(machines are numbered 0..{num_machines - 1})."
        )
    gpus = 0 if use_cpu else visible_gpu_count(env, config.gpu_ids)
    num_processes = config.num_processes
    if num_processes is None and kind is not DistributedType.XLA:
        num_processes = max(1, gpus) * num_machines
        if not have_file:
            notes.append(
                f"--num_processes not given and no config file: using {num_processes} "
                "(run `accel config` or pass --num_processes to choose)"
            )
    per_node = 1
    if num_processes is not None:
        if num_processes % num_machines and min_machines is not None:
            raise LaunchArgumentError(
                f"--num_processes {num_processes} is not a multiple of the most machines of "
                f"--num_machines {min_machines}:{num_machines}: with an elastic range it counts "
                f"the processes at {num_machines} machines (every machine runs the same number). "
                f"Pass e.g. --num_processes {num_machines * max(1, num_processes // num_machines)}."
            )
        if num_processes % num_machines:
            raise LaunchArgumentError(
                f"--num_processes {num_processes} is not a multiple of --num_machines "
                f"{num_machines}: --num_processes counts processes on ALL machines, and every "
                "machine runs the same number. Pass a multiple, e.g. "
                f"--num_processes {num_machines * max(1, num_processes // num_machines)}."
            )
        per_node = num_processes // num_machines
    _check_gpus_suffice(per_node, gpus, kind, config.gpu_ids)
    for machines in range(min_machines or num_machines, num_machines + 1):
        # An elastic job may run on any machine count of its range.
        _check_parallelism(config, kind, None if num_processes is None else per_node * machines)
    if num_machines > 1 and not config.main_process_ip:
        raise LaunchArgumentError(
            f"--num_machines {num_machines} needs --main_process_ip: the address of machine 0, "
            "which every machine can reach."
        )
    if (
        kind is DistributedType.DEEPSPEED
        and num_machines > 1
        and config.deepspeed_config.deepspeed_multinode_launcher not in (None, "standard")
    ):
        raise LaunchArgumentError(
            f"deepspeed_multinode_launcher={config.deepspeed_config.deepspeed_multinode_launcher!r} "
            "is not supported: accel starts every machine through torch elastic ('standard'). "
            "Run `accel launch` on each machine with --deepspeed_multinode_launcher standard."
        )
    fault_tolerance = replica_groups(
        num_machines,
        replicas=options.ft_replicas,
        min_replicas=options.ft_min_replicas,
        lighthouse=options.ft_lighthouse,
        replica_id=options.ft_replica_id,
    )
    if fault_tolerance is not None:
        from accel_state.torch_compat import GATES as TORCH_GATES  # imports torch: only here

        TORCH_GATES["replica_groups"].require(error=LaunchTorchFeatureError)
    if fault_tolerance is not None and kind is DistributedType.XLA:
        raise LaunchArgumentError(
            "--ft_replicas / --ft_lighthouse with --tpu: replica groups run through torch elastic "
            "and torchft's gloo/NCCL groups, not torch_xla's launcher."
        )
    if fault_tolerance is not None and min_machines is not None:
        raise LaunchArgumentError(
            f"--ft_* with --num_machines {min_machines}:{num_machines}: a replica group has a "
            "fixed size; fault tolerance comes from the other groups, not from an elastic range."
        )
    if kind is DistributedType.XLA:
        mode = XLA
    elif fault_tolerance is not None:
        mode = ELASTIC  # every group has its own store (MASTER_ADDR/PORT), which torchft uses
    elif (
        num_processes == 1
        and num_machines == 1
        and kind in (None, DistributedType.NO)
        and not config.max_restarts
    ):
        mode = SINGLE
    else:
        mode = ELASTIC

    rdzv_backend = config.rdzv_backend or "static"
    if min_machines is not None:
        rdzv_backend = _elastic_backend(flags, config, notes)
    rdzv_conf = parse_rdzv_conf(config.rdzv_conf)
    host = config.main_process_ip or "127.0.0.1"
    if num_machines == 1:
        # Like torchrun on one machine: a c10d store, on a port the OS picks unless one is given.
        # (Static rendezvous would reuse one store across restarts; see _rendezvous_env.)
        rdzv_backend, run_id = "c10d", uuid.uuid4().hex
        endpoint = _endpoint(host, config.main_process_port or 0)
    else:
        run_id = "none"
        endpoint = _endpoint(host, config.main_process_port or DEFAULT_PORT)

    contract = _contract(config, kind, use_cpu)
    worker_env = contract.to_env()
    worker_env.update(_thread_env(config, mode, use_cpu or gpus == 0, per_node, env))
    worker_env.update(_intel_openmp_env(use_cpu, env))
    worker_env.update(_rendezvous_env(mode, rdzv_backend, config.max_restarts or 0, env))
    worker_env.update(_xla_bf16_env(config, kind, bool(flags.downcast_bf16)))
    worker_env.update(_feature_env(config, kind))
    worker_env.update(_as_accelerate_env(options.as_accelerate))
    worker_env.update(parse_env_assignments(options.env))
    notes.extend(_mode_notes(flags, options, mode, num_machines))
    interface, local_addr = _network(mode, num_machines, host, {**env, **worker_env})
    if interface is None and fault_tolerance is not None:
        interface = _replica_group_interface(fault_tolerance, {**env, **worker_env})
    if interface is not None:
        worker_env.update(interface.env())
    worker_env.update(_replica_group_address(fault_tolerance, {**env, **worker_env}))
    gpu_ids = parse_gpu_ids(config.gpu_ids)
    if gpu_ids is not None and not use_cpu:
        worker_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    return LaunchPlan(
        mode=mode,
        target=options.target or "",
        target_args=options.target_args,
        module=options.module,
        no_python=options.no_python,
        num_processes=num_processes,
        num_machines=num_machines,
        min_machines=min_machines,
        machine_rank=machine_rank,
        nproc_per_node=per_node,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=endpoint,
        rdzv_conf=rdzv_conf,
        run_id=run_id,
        max_restarts=config.max_restarts or 0,
        monitor_interval=config.monitor_interval or 0.1,
        tee=options.tee,
        log_dir=options.log_dir,
        role=options.role or "default",
        quiet=options.quiet,
        main_training_function=config.main_training_function or "main",
        use_cpu=use_cpu,
        uses_gpus=gpus > 0 and kind is not DistributedType.XLA,
        contract=contract,
        env=worker_env,
        notes=tuple(notes),
        interface=interface,
        local_addr=local_addr,
        fault_tolerance=fault_tolerance,
    )


def _replica_group_interface(
    groups: ReplicaGroups, environ: Mapping[str, str]
) -> RouteChoice | None:
    """For a group that joins a lighthouse elsewhere: the interface that routes to it.

    The groups average across machines over gloo (or NCCL), which would advertise the address
    of the hostname, as for any job on several machines; None when the lighthouse is on this
    machine or the user chose an interface.
    """
    if groups.lighthouse is None:
        return None
    choice = choose_interface(lighthouse_host(groups.lighthouse), environ)
    return None if choice is None else dataclasses.replace(choice, toward="the lighthouse")


def _replica_group_address(
    groups: ReplicaGroups | None, environ: Mapping[str, str]
) -> dict[str, str]:
    """``ACCEL_FT_ADDRESS``: this machine's address toward the lighthouse, when it is elsewhere.

    torchft publishes it (instead of the hostname and a loopback ``MASTER_ADDR``) for this
    group's store, manager and healing copies, which the groups on other machines connect to.
    One the user set (in the environment or with ``--env``) wins; set empty, torchft chooses.
    """
    if groups is None or groups.lighthouse is None or FT_ADDRESS in environ:
        return {}
    address = local_address(lighthouse_host(groups.lighthouse), environ)
    return {} if address is None else {FT_ADDRESS: address}


def _network(
    mode: str, num_machines: int, main_host: str, environ: Mapping[str, str]
) -> tuple[RouteChoice | None, str | None]:
    """The interface to set for the workers and this machine's address, for several machines.

    On one machine no interface is chosen, and the rendezvous publishes the endpoint's host
    (loopback unless ``--main_process_ip`` says otherwise): torch would publish the hostname,
    which need not resolve.
    """
    if mode != ELASTIC:
        return None, None
    if num_machines == 1:
        return None, main_host
    return choose_interface(main_host, environ), local_address(main_host, environ)
