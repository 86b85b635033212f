"""Enumerations shared by every accel package: distributed mode, precision, RNG kinds."""

from __future__ import annotations

from enum import Enum, EnumMeta


class _NamedStrEnum(str, Enum):
    """A string enum that compares equal to its value and prints as ``Class.MEMBER``.

    Accelerate's ``DistributedType`` and ``ComputeEnvironment`` print this way
    (``str(DistributedType.NO) == "DistributedType.NO"``); use ``.value`` for the bare name.
    """

    @classmethod
    def list(cls) -> list[str]:
        """Return the values of all members, aliases excluded."""
        return [member.value for member in cls]


class _StrEnum(str, Enum):
    """A string enum that compares equal to its value and prints as it."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """Return the values of all members, aliases excluded."""
        return [member.value for member in cls]


class DistributedType(_NamedStrEnum):
    """How the current job is distributed.

    ``TPU`` is accepted as an alias of ``XLA`` (``DistributedType.TPU is DistributedType.XLA``).
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    TPU = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"

    @classmethod
    def _missing_(cls, value: object) -> DistributedType | None:
        if isinstance(value, str) and value.upper() == "TPU":
            return cls.XLA
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls.__members__[value.upper()]
        return None


class PrecisionType(_StrEnum):
    """Mixed-precision modes."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"

    @classmethod
    def _missing_(cls, value: object) -> PrecisionType | None:
        if isinstance(value, str) and value.lower() in {m.value for m in cls}:
            return cls(value.lower())
        return None


class RNGType(_StrEnum):
    """Random number generators that can be synchronised across processes."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    MPS = "mps"
    GENERATOR = "generator"


class ComputeEnvironment(_NamedStrEnum):
    """Where the job runs, as written in launcher config files."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class EnumWithContains(EnumMeta):
    """An enum metaclass whose ``in`` also accepts values: ``"fp16" in MyEnum``."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(Enum, metaclass=EnumWithContains):
    """Accelerate's enum base: ``str(member)`` is its value, ``list()`` gives every value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """The values of every member, as strings."""
        return [str(member) for member in cls]
