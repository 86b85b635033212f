"""``accel config``: the interactive questionnaire.

Answers may be piped on stdin, one per line; an empty line or the end of input takes the default
shown in brackets.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from accel_launch.config.fields import float_parser, int_parser, parse_bool
from accel_launch.config.schema import (
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FSDP_STATE_DICT_TYPES,
    OFFLOAD_DEVICES,
    RDZV_BACKENDS,
    AccelConfig,
    DeepSpeedConfig,
    DynamoConfig,
    FsdpConfig,
)
from accel_launch.errors import ConfigError
from accel_state.types import ComputeEnvironment, DistributedType

MAX_TRIES = 5


class Asker:
    """Asks one question at a time on ``output`` and reads answers from ``input_stream``."""

    def __init__(self, input_stream: TextIO | None = None, output: TextIO | None = None) -> None:
        self.input = input_stream if input_stream is not None else sys.stdin
        self.output = output if output is not None else sys.stdout
        self.exhausted = False

    def _read(self, prompt: str) -> str:
        self.output.write(prompt)
        self.output.flush()
        if self.exhausted:
            self.output.write("\n")
            return ""
        line = self.input.readline()
        if not line:
            self.exhausted = True
            self.output.write("\n")
            return ""
        if not self.input.isatty():
            self.output.write(line if line.endswith("\n") else line + "\n")
        return line.strip()

    def ask(
        self, question: str, default: Any, convert: Callable[[str], Any], hint: str = ""
    ) -> Any:
        """Ask until ``convert`` accepts the answer; empty answers give ``default``."""
        shown = f" [{default}]" if default is not None and default != "" else ""
        for _ in range(MAX_TRIES):
            answer = self._read(f"{question}{hint}{shown}: ")
            if answer == "":
                return default
            try:
                return convert(answer)
            except (ConfigError, ValueError) as error:
                self.output.write(f"  invalid answer: {error}\n")
        raise ConfigError(f"no valid answer after {MAX_TRIES} tries", key=question)

    def yes_no(self, question: str, default: bool = False) -> bool:
        """A yes/no question."""
        hint = " [YES/no]" if default else " [yes/NO]"
        value = self.ask(f"{question}{hint}", "", lambda text: parse_bool("answer", text))
        return default if value == "" else bool(value)

    def choose(self, question: str, options: Sequence[str], default: int = 0) -> str:
        """Pick one of ``options`` by number or by name."""
        lines = [question] + [f"  [{index}] {option}" for index, option in enumerate(options)]
        self.output.write("\n".join(lines) + "\n")

        def convert(text: str) -> str:
            if text.isdigit() and int(text) < len(options):
                return options[int(text)]
            for option in options:
                if option.lower() == text.lower():
                    return option
            raise ValueError(f"answer with a number 0-{len(options) - 1} or one of the names")

        return str(self.ask("Your choice", options[default], convert))

    def integer(self, question: str, default: int, minimum: int = 0) -> int:
        """An integer ``>= minimum``."""
        parse = int_parser(minimum)
        return int(self.ask(question, default, lambda text: parse("answer", text)))

    def number(self, question: str, default: float) -> float:
        """A non-negative number."""
        parse = float_parser(0.0)
        return float(self.ask(question, default, lambda text: parse("answer", text)))

    def text(self, question: str, default: str = "") -> str:
        """Free text."""
        return str(self.ask(question, default, str))


MACHINE_TYPES = {
    "No distributed training": DistributedType.NO,
    "multi-CPU": DistributedType.MULTI_CPU,
    "multi-XPU": DistributedType.MULTI_XPU,
    "multi-GPU": DistributedType.MULTI_GPU,
    "TPU (XLA)": DistributedType.XLA,
}


def _machines(asker: Asker, values: dict[str, Any]) -> None:
    machines = asker.integer(
        "How many different machines will you use (more than 1 for multi-node)?", 1, 1
    )
    values["num_machines"] = machines
    if machines == 1:
        return
    values["machine_rank"] = asker.integer("What is the rank of this machine?", 0)
    values["main_process_ip"] = asker.text(
        "What is the IP address of the machine hosting the main process?"
    )
    values["main_process_port"] = asker.integer(
        "What port will the main process listen on?", 29500, 1
    )
    values["same_network"] = asker.yes_no("Are all the machines on the same local network?", True)
    values["rdzv_backend"] = asker.choose("What rendezvous backend will you use?", RDZV_BACKENDS)


def _dynamo(asker: Asker) -> DynamoConfig:
    if not asker.yes_no("Do you wish to optimize your script with torch dynamo?"):
        return DynamoConfig()
    backend = asker.choose("Which dynamo backend would you like to use?", DYNAMO_BACKENDS[1:], 2)
    if not asker.yes_no("Do you want to customize the defaults sent to torch.compile?"):
        return DynamoConfig(dynamo_backend=backend)
    return DynamoConfig(
        dynamo_backend=backend,
        dynamo_mode=asker.choose("Which mode do you want to use?", DYNAMO_MODES),
        dynamo_use_fullgraph=asker.yes_no("Do you want fullgraph mode (no graph breaks)?"),
        dynamo_use_dynamic=asker.yes_no("Do you want to enable dynamic shape tracing?"),
    )


def _deepspeed(asker: Asker, machines: int) -> DeepSpeedConfig:
    if asker.yes_no("Do you want to specify a json file to a DeepSpeed config?"):
        return DeepSpeedConfig(
            deepspeed_config_file=asker.text(
                "Please enter the path to the json DeepSpeed config file"
            ),
            zero3_init_flag=asker.yes_no("Do you want to enable `deepspeed.zero.Init` (ZeRO-3)?"),
            deepspeed_multinode_launcher="standard" if machines > 1 else None,
        )
    stage = int(
        asker.choose(
            "What should be your DeepSpeed's ZeRO optimization stage?", ["0", "1", "2", "3"], 2
        )
    )
    optimizer = (
        asker.choose("Where to offload optimizer states?", OFFLOAD_DEVICES) if stage >= 2 else None
    )
    params = asker.choose("Where to offload parameters?", OFFLOAD_DEVICES) if stage == 3 else None
    steps = asker.integer(
        "How many gradient accumulation steps are you passing in your script?", 1, 1
    )
    clipping = None
    if asker.yes_no("Do you want to use gradient clipping?"):
        clipping = asker.number("What is the gradient clipping value?", 1.0)
    return DeepSpeedConfig(
        zero_stage=stage,
        offload_optimizer_device=optimizer,
        offload_param_device=params,
        gradient_accumulation_steps=steps,
        gradient_clipping=clipping,
        zero3_init_flag=asker.yes_no("Do you want to enable `deepspeed.zero.Init`?")
        if stage == 3
        else None,
        deepspeed_multinode_launcher="standard" if machines > 1 else None,
    )


def _fsdp(asker: Asker) -> FsdpConfig:
    strategy = asker.choose("What should be your sharding strategy?", FSDP_SHARDING_STRATEGIES)
    offload = asker.yes_no("Do you want to offload parameters and gradients to CPU?")
    policy = asker.choose("What should be your auto wrap policy?", FSDP_AUTO_WRAP_POLICIES)
    layers = min_params = None
    if policy == "TRANSFORMER_BASED_WRAP":
        layers = asker.text("Which transformer layer class(es) to wrap (comma-separated)?") or None
    elif policy == "SIZE_BASED_WRAP":
        min_params = asker.integer(
            "What should be your FSDP's minimum number of parameters?", 100_000_000
        )
    prefetch = asker.choose("What should be your backward prefetch policy?", FSDP_BACKWARD_PREFETCH)
    state_dict = asker.choose("What should be your state dict type?", FSDP_STATE_DICT_TYPES, 2)
    ram_efficient = asker.yes_no(
        "Do you want to load weights on rank 0 only (CPU RAM efficient loading)?", True
    )
    return FsdpConfig(
        fsdp_sharding_strategy=strategy,
        fsdp_offload_params=offload,
        fsdp_auto_wrap_policy=policy,
        fsdp_transformer_layer_cls_to_wrap=layers,
        fsdp_min_num_params=min_params,
        fsdp_backward_prefetch=prefetch,
        fsdp_forward_prefetch=asker.yes_no("Do you want to enable FSDP's forward prefetch policy?"),
        fsdp_state_dict_type=state_dict,
        fsdp_use_orig_params=asker.yes_no(
            "Do you want to use the original parameters (use_orig_params)?", True
        ),
        fsdp_cpu_ram_efficient_loading=ram_efficient,
        fsdp_sync_module_states=True
        if ram_efficient
        else asker.yes_no("Broadcast module states from rank 0?", True),
        fsdp_activation_checkpointing=asker.yes_no(
            "Do you want to enable activation checkpointing?"
        ),
    )


def run_questionnaire(asker: Asker | None = None) -> AccelConfig:
    """Ask the questions and return the resulting config (not yet written)."""
    ask = asker or Asker()
    values: dict[str, Any] = {"compute_environment": ComputeEnvironment.LOCAL_MACHINE.value}
    kind = MACHINE_TYPES[ask.choose("Which type of machine are you using?", list(MACHINE_TYPES))]
    distributed = kind in (
        DistributedType.MULTI_CPU,
        DistributedType.MULTI_XPU,
        DistributedType.MULTI_GPU,
    )
    values["num_machines"], values["machine_rank"] = 1, 0
    if distributed:
        _machines(ask, values)
        values["debug"] = ask.yes_no(
            "Should distributed operations be checked while running for errors? "
            "This can avoid timeout issues but will be slower."
        )
    use_cpu = kind is DistributedType.MULTI_CPU or (
        kind is DistributedType.NO
        and ask.yes_no("Do you want to run your training on CPU only (even if a GPU is available)?")
    )
    values["use_cpu"] = use_cpu
    dynamo = _dynamo(ask) if kind is not DistributedType.XLA else DynamoConfig()
    deepspeed, fsdp = DeepSpeedConfig(), FsdpConfig()
    gpu_like = kind in (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)
    if gpu_like and not use_cpu and ask.yes_no("Do you want to use DeepSpeed?"):
        kind, deepspeed = DistributedType.DEEPSPEED, _deepspeed(ask, values["num_machines"])
    elif kind is DistributedType.MULTI_GPU and ask.yes_no(
        "Do you want to use FullyShardedDataParallel?"
    ):
        kind, fsdp = DistributedType.FSDP, _fsdp(ask)
    if kind is DistributedType.XLA:
        values["num_processes"] = ask.integer(
            "How many XLA devices (processes) should be used?", 8, 1
        )
        values["main_training_function"] = ask.text(
            "What is the name of the function in your script that should be launched?", "main"
        )
        values["downcast_bf16"] = ask.yes_no("Should torch.float be stored as bfloat16 on XLA?")
    elif distributed or kind in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        what = "processes" if use_cpu else "GPU(s)"
        values["num_processes"] = ask.integer(
            f"How many {what} should be used in total (all machines)?", 1, 1
        )
    else:
        values["num_processes"] = 1
    if not use_cpu and kind is not DistributedType.XLA:
        values["gpu_ids"] = ask.text(
            "What GPU(s) (by id) should be used on this machine, comma-separated?", "all"
        )
    values["mixed_precision"] = ask.choose(
        "Do you wish to use mixed precision?", ["no", "fp16", "bf16", "fp8"]
    )
    values["distributed_type"] = kind.value
    values["rdzv_backend"] = values.get("rdzv_backend", "static")
    values["same_network"] = values.get("same_network", True)
    return AccelConfig(**values, dynamo_config=dynamo, deepspeed_config=deepspeed, fsdp_config=fsdp)


__all__ = ["Asker", "run_questionnaire"]
