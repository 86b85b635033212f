"""What transformers' Trainer, PEFT and TRL call on accel's FSDP plugin and utilities.

The plugin methods and readings run here; a 2-process job (``fsdp_trainer_workers``) checks
the launcher's plugin, auto-wrap policy functions, regex ``ignored_modules``,
``adapter_only`` and ``set_state_dict_type`` on real sharded models. The Trainer itself runs in
``tests-integration/ecosystem/test_trainer_fsdp.py``.
"""

from __future__ import annotations

import functools

import fsdp_trainer_workers
import pytest
import torch
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    FullStateDictConfig,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)

from accel import FullyShardedDataParallelPlugin
from accel.errors import AcceleratorConfigError
from accel_state.testing import spawn_workers

pytestmark = pytest.mark.timeout(900)


def test_set_state_dict_type_switches_and_drops_configs_of_the_other_type():
    plugin = FullyShardedDataParallelPlugin(state_dict_config=ShardedStateDictConfig())
    assert plugin.resolved().state_dict_type == "SHARDED_STATE_DICT"
    plugin.set_state_dict_type("FULL_STATE_DICT")
    assert plugin.state_dict_type == "FULL_STATE_DICT" and plugin.state_dict_config is None
    assert plugin.resolved().state_dict_type == "FULL_STATE_DICT"
    plugin.set_state_dict_type(StateDictType.SHARDED_STATE_DICT)
    assert plugin.state_dict_type == "SHARDED_STATE_DICT"
    plugin.set_state_dict_type()  # None keeps the type
    assert plugin.state_dict_type == "SHARDED_STATE_DICT"
    kept = FullyShardedDataParallelPlugin(state_dict_config=FullStateDictConfig())
    kept.set_state_dict_type("full_state_dict")
    assert isinstance(kept.state_dict_config, FullStateDictConfig)
    with pytest.raises(AcceleratorConfigError, match=r"LOCAL_STATE_DICT.*FULL_STATE_DICT"):
        plugin.set_state_dict_type("LOCAL_STATE_DICT")


def test_set_mixed_precision_builds_torch_policies_as_accelerate():
    fsdp2 = FullyShardedDataParallelPlugin(fsdp_version=2)
    fsdp2.set_mixed_precision("bf16")
    policy = fsdp2.mixed_precision_policy
    assert isinstance(policy, MixedPrecisionPolicy)
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16,) * 3
    fsdp2.set_mixed_precision("fp16")  # without override the policy stays
    assert fsdp2.mixed_precision_policy is policy
    fsdp2.set_mixed_precision(torch.float16, override=True)
    assert fsdp2.mixed_precision_policy.param_dtype == torch.float16
    fsdp1 = FullyShardedDataParallelPlugin(fsdp_version=1)
    fsdp1.set_mixed_precision("bf16", buffer_autocast=True)
    assert isinstance(fsdp1.mixed_precision_policy, MixedPrecision)
    assert fsdp1.mixed_precision_policy.buffer_dtype == torch.float32
    as_dict = FullyShardedDataParallelPlugin(
        fsdp_version=2, mixed_precision_policy={"param_dtype": "bfloat16"}
    )
    as_dict.set_mixed_precision("fp16")
    assert as_dict.mixed_precision_policy.param_dtype == torch.bfloat16
    as_dict.validate_mixed_precision_policy()
    with pytest.raises(AcceleratorConfigError, match=r"set_mixed_precision.*bf16"):
        fsdp2.set_mixed_precision("fp4")
    with pytest.raises(AcceleratorConfigError, match="mixed_precision_policy"):
        FullyShardedDataParallelPlugin(mixed_precision_policy=3).validate_mixed_precision_policy()


@pytest.mark.parametrize(
    ("value", "strategy"),
    [
        ("full_shard", "FULL_SHARD"),
        ("shard_grad_op", "SHARD_GRAD_OP"),
        ("NO_SHARD", "NO_SHARD"),
        (ShardingStrategy.HYBRID_SHARD, "HYBRID_SHARD"),
        ("2", "SHARD_GRAD_OP"),
    ],
)
def test_fsdp1_takes_the_sharding_strategy_in_reshard_after_forward(value, strategy):
    # transformers' Trainer passes reshard_after_forward="full_shard" for FSDP1, as Accelerate takes.
    settings = FullyShardedDataParallelPlugin(
        fsdp_version=1, reshard_after_forward=value
    ).resolved()
    assert settings.sharding_strategy == strategy


def test_reshard_after_forward_strategy_names_under_fsdp2_and_conflicts():
    full = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward="FULL_SHARD")
    assert full.resolved().reshard_after_forward is True
    grad_op = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward="shard_grad_op")
    assert grad_op.resolved().reshard_after_forward is False
    with pytest.raises(AcceleratorConfigError, match="no FSDP2 equivalent"):
        FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward="NO_SHARD").resolved()
    with pytest.raises(AcceleratorConfigError, match="disagree"):
        FullyShardedDataParallelPlugin(
            fsdp_version=1, sharding_strategy="SHARD_GRAD_OP", reshard_after_forward="full_shard"
        ).resolved()
    with pytest.raises(AcceleratorConfigError, match="FSDP2 setting"):
        FullyShardedDataParallelPlugin(fsdp_version=1, reshard_after_forward="true").resolved()


def test_from_launcher_and_fill_unset_hold_the_resolved_values():
    launcher = {
        "fsdp_version": 1,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": "true",
    }
    plugin = FullyShardedDataParallelPlugin.from_launcher(launcher)
    assert plugin.fsdp_version == 1 and plugin.sharding_strategy == "FULL_SHARD"
    assert plugin.reshard_after_forward is None  # an FSDP2 setting stays unset under FSDP1
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)  # what the Trainer tests
    assert plugin.transformer_cls_names_to_wrap == ["BertLayer"]
    assert plugin.auto_wrap_policy == "transformer_based_wrap"
    assert plugin.cpu_ram_efficient_loading is True and plugin.activation_checkpointing is False
    assert plugin.resolved(launcher) == plugin.resolved()
    # A plugin's own values stay; only unset fields are filled.
    mine = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="FULL_STATE_DICT")
    mine.fill_unset(launcher)
    assert (mine.fsdp_version, mine.state_dict_type, mine.reshard_after_forward) == (
        2,
        "FULL_STATE_DICT",
        True,
    )
    trainer_fsdp1 = FullyShardedDataParallelPlugin(
        fsdp_version=1, reshard_after_forward="full_shard"
    )
    trainer_fsdp1.fill_unset()
    assert trainer_fsdp1.resolved().sharding_strategy == "FULL_SHARD"


def test_torch_offload_objects_read_as_flags():
    def offload(value):
        return FullyShardedDataParallelPlugin(cpu_offload=value).resolved().cpu_offload

    assert offload(CPUOffloadPolicy()) is True
    assert offload(OffloadPolicy()) is False  # torch's "no offloading" policy
    assert offload(CPUOffload(offload_params=True)) is True
    assert offload(False) is False


def test_a_policy_function_is_accepted_and_asked_like_torch_asks_it():
    from fsdp_workers import Block, make_model
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from accel.strategies.fsdp.strategy import _policy_units

    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    settings = FullyShardedDataParallelPlugin(auto_wrap_policy=policy).resolved()
    assert settings.wrap_policy == "CALLABLE" and settings.wrap_policy_fn is policy
    units = _policy_units(make_model(), policy)
    assert [type(unit).__name__ for unit in units] == ["Block", "Block"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("fsdp_trainer")
    return spawn_workers(
        fsdp_trainer_workers.trainer_surface_job, 2, args=(str(folder),), timeout=600
    )


def test_a_job_launched_with_fsdp_has_the_launchers_plugin_in_its_state(launched):
    for rank in launched:
        assert rank["launched"] == {
            "type": "FullyShardedDataParallelPlugin",
            "same_object": True,
            "fsdp_version": 2,
            "state_dict_type": "SHARDED_STATE_DICT",
            "layers": ["Block"],
            "reshard_after_forward": True,
            "activation_checkpointing": False,
            "distributed_type": "DistributedType.FSDP",
            "sharded": True,
        }


def test_policy_functions_choose_the_units_under_fsdp1_and_fsdp2(launched):
    for rank in launched:
        policies = rank["policies"]
        assert policies["transformer_fsdp1"] == ["FullyShardedDataParallel"] * 2
        assert policies["transformer_fsdp2"] == ["FSDPBlock"] * 2
        # Every Linear: qkv, proj and two MLP layers in each block, and the head.
        assert policies["lambda_fsdp2"] == ["FSDPLinear"] * 9


def test_ignored_modules_as_a_regex_stay_whole(launched):
    for rank in launched:
        for version in ("fsdp1", "fsdp2"):
            assert rank["ignored"][version] == {"head_whole": True, "loss_finite": True}


def test_adapter_only_is_ignored_for_plain_models_and_keeps_frozen_weights(launched):
    for rank in launched:
        adapter = rank["adapter_only"]
        assert adapter["SHARDED_STATE_DICT"] == {"name": "pytorch_model_fsdp_0", "restored": True}
        assert adapter["FULL_STATE_DICT"] == {"name": "pytorch_model_fsdp.bin", "restored": True}
        assert adapter["trainable_only"] == {
            "embed_saved": False,
            "head_saved": True,
            "trainable_restored": True,
            "frozen_untouched": True,
        }


def test_set_state_dict_type_after_prepare_reaches_save_state(launched):
    for rank in launched:
        switched = rank["switched"]
        assert switched["plugin_type"] == "FULL_STATE_DICT"
        assert any(name.endswith("model.safetensors") for name in switched["files"]), switched


def test_a_job_launched_with_deepspeed_has_the_launchers_plugin_in_its_state(monkeypatch):
    from accel.state import AcceleratorState
    from accel.utils import DeepSpeedPlugin

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCEL_DEEPSPEED_CONFIG", '{"zero_stage": 2}')
    state = AcceleratorState(cpu=True)
    assert isinstance(state.deepspeed_plugin, DeepSpeedPlugin)
    assert state.deepspeed_plugin.zero_stage == 2
    assert state.fsdp_plugin is None
    assert str(state.distributed_type) == "DistributedType.DEEPSPEED"
