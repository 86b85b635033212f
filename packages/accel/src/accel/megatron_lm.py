"""Accelerate's Megatron-LM names: present so imports work, refusing when used.

Megatron-LM is not a target of accel (it needs NVIDIA's Megatron-LM package, CUDA and its own
model classes); train large models with FSDP2, DeepSpeed or a ParallelismConfig instead.

Example:
    >>> from accel.utils import MegatronLMPlugin
    >>> MegatronLMPlugin()  # doctest: +SKIP
    Traceback (most recent call last):
    accel.errors.UnsupportedFeatureError: MegatronLMPlugin: Megatron-LM is not supported by accel...
"""

from __future__ import annotations

from typing import Any, NoReturn

from accel.errors import UnsupportedFeatureError

_WHY = (
    "Megatron-LM is not supported by accel (it needs NVIDIA's Megatron-LM package, CUDA and "
    "its model classes); shard large models with FSDP2 (fsdp_plugin=...), DeepSpeed "
    "(deepspeed_plugin=...) or a ParallelismConfig (tensor/context parallel) instead."
)


def _refuse(name: str) -> NoReturn:
    raise UnsupportedFeatureError(f"{name}: {_WHY}")


class MegatronLMPlugin:
    """Accelerate's Megatron-LM settings; refused (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse("MegatronLMPlugin")


class MegatronLMDummyDataLoader:
    """Accelerate's Megatron-LM dataset placeholder; refused."""

    def __init__(self, **dataset_kwargs: Any) -> None:
        _refuse("MegatronLMDummyDataLoader")


class MegatronLMDummyScheduler:
    """Accelerate's Megatron-LM scheduler placeholder; refused."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        **kwargs: Any,
    ) -> None:
        _refuse("MegatronLMDummyScheduler")


class AbstractTrainStep:
    """Accelerate's Megatron-LM train-step base class; refused."""

    def __init__(self, name: str) -> None:
        _refuse(type(self).__name__)


class BertTrainStep(AbstractTrainStep):
    """Accelerate's Megatron-LM BERT train step; refused."""

    def __init__(self, accelerator: Any, args: Any) -> None:
        _refuse("BertTrainStep")


class GPTTrainStep(AbstractTrainStep):
    """Accelerate's Megatron-LM GPT train step; refused."""

    def __init__(self, accelerator: Any, args: Any) -> None:
        _refuse("GPTTrainStep")


class T5TrainStep(AbstractTrainStep):
    """Accelerate's Megatron-LM T5 train step; refused."""

    def __init__(self, accelerator: Any, args: Any) -> None:
        _refuse("T5TrainStep")


def add_model_config_to_megatron_parser(model_type: str) -> NoReturn:
    """Accelerate's Megatron-LM argument-parser registry; refused."""
    _refuse("add_model_config_to_megatron_parser")


def avg_losses_across_data_parallel_group(losses: Any) -> NoReturn:
    """Accelerate's Megatron-LM loss averaging; refused (use ``accelerator.reduce``)."""
    _refuse("avg_losses_across_data_parallel_group")


__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMPlugin",
    "T5TrainStep",
    "add_model_config_to_megatron_parser",
    "avg_losses_across_data_parallel_group",
]
