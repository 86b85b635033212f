import pytest

from accel_state import DistributedType, PrecisionType, RNGType


def test_tpu_is_an_alias_of_xla():
    assert DistributedType.TPU is DistributedType.XLA
    assert DistributedType("TPU") is DistributedType.XLA
    assert DistributedType("tpu") is DistributedType.XLA


def test_members_used_by_the_seeds_exist_and_compare_as_strings():
    for name in ("NO", "MULTI_CPU", "MULTI_GPU", "XLA", "DEEPSPEED", "FSDP", "MEGATRON_LM"):
        assert DistributedType[name] == name
    assert str(DistributedType.MULTI_CPU) == "DistributedType.MULTI_CPU"  # as Accelerate
    assert f"{DistributedType.NO}" == "DistributedType.NO"
    assert DistributedType.MULTI_CPU.value == "MULTI_CPU"
    assert "TPU" not in DistributedType.list()


def test_precision_parses_any_case_and_rejects_unknown():
    assert PrecisionType("BF16") is PrecisionType.BF16
    assert PrecisionType.list() == ["no", "fp8", "fp16", "bf16"]
    with pytest.raises(ValueError):
        PrecisionType("fp64")


def test_rng_types():
    assert RNGType("generator") is RNGType.GENERATOR
    assert RNGType.TORCH == "torch"


def test_every_accelerate_member_exists_with_its_name_as_value():
    for name in ("MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_HPU", "MULTI_NEURON"):
        assert DistributedType[name].value == name
        assert DistributedType(name.lower()) is DistributedType[name]
