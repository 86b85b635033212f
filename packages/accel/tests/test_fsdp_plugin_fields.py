"""FullyShardedDataParallelPlugin's state_dict_config, optim_state_dict_config, param_init_fn and
activation_checkpointing_offload (Accelerate 1.15's fields), on 2 CPU/gloo processes."""

from __future__ import annotations

import math

import fsdp_workers
import pytest
import torch
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
)

from accel import AcceleratorConfigError, FullyShardedDataParallelPlugin
from accel.strategies.fsdp.strategy import checkpoint_activations, initialize_meta_modules
from accel_state.testing import spawn_workers

SIZE, STEPS = 8, 3


def test_state_dict_configs_choose_the_state_dict_type():
    full = FullyShardedDataParallelPlugin(
        state_dict_config=FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True),
    )
    assert full.resolved().state_dict_type == "FULL_STATE_DICT"
    sharded = FullyShardedDataParallelPlugin(state_dict_config=ShardedStateDictConfig())
    assert sharded.resolved().state_dict_type == "SHARDED_STATE_DICT"
    with pytest.raises(AcceleratorConfigError, match="make them agree"):
        FullyShardedDataParallelPlugin(
            state_dict_type="SHARDED_STATE_DICT", state_dict_config=FullStateDictConfig()
        ).resolved()
    with pytest.raises(AcceleratorConfigError, match="different types"):
        FullyShardedDataParallelPlugin(
            state_dict_config=FullStateDictConfig(),
            optim_state_dict_config=ShardedOptimStateDictConfig(),
        ).resolved()


def test_checkpoint_offload_needs_checkpointing_and_fsdp2_and_init_fn_a_function():
    with pytest.raises(AcceleratorConfigError, match="needs activation_checkpointing=True"):
        FullyShardedDataParallelPlugin(activation_checkpointing_offload=True).resolved()
    with pytest.raises(AcceleratorConfigError, match="needs fsdp_version=2"):
        FullyShardedDataParallelPlugin(
            fsdp_version=1, activation_checkpointing=True, activation_checkpointing_offload=True
        ).resolved()
    with pytest.raises(AcceleratorConfigError, match="param_init_fn"):
        FullyShardedDataParallelPlugin(param_init_fn="to_empty").resolved()


def test_offloaded_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    wrapped = torch.nn.Sequential(*(torch.nn.Sequential(m) for m in plain))
    wrapped.load_state_dict({k.replace(".", ".0.", 1): v for k, v in plain.state_dict().items()})
    checkpoint_activations(wrapped, list(wrapped), offload=True)
    assert {type(m).__name__ for m in wrapped.children()} == {"OffloadWrapper"}
    inputs = torch.randn(5, 4)
    plain(inputs).sum().backward()
    wrapped(inputs).sum().backward()
    for a, b in zip(plain.parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_initialize_meta_modules_calls_the_function_on_each_meta_module():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    seen: list[torch.nn.Module] = []

    def init(module: torch.nn.Module) -> None:
        seen.append(module)
        module.to_empty(device="cpu", recurse=False)

    initialize_meta_modules(model, init)
    assert seen == [model[0], model[2]]
    assert not any(p.is_meta for p in model.parameters())


@pytest.fixture(scope="module")
def job():
    return spawn_workers(fsdp_workers.plugin_fields_job, 2, args=(SIZE, STEPS), timeout=600)[0]


@pytest.mark.timeout(700)
def test_fsdp2_trains_with_offloaded_checkpoints_and_from_a_meta_model(job):
    reference = fsdp_workers.reference_losses(STEPS, SIZE, 1e-2)
    assert job["wrappers"] == ["CheckpointWrapper", "OffloadWrapper"]  # offload around checkpoint
    for got, want in zip(job["offloaded"]["losses"], reference, strict=True):
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)
    assert job["initialized"] == job["modules_with_tensors"] > 0
    assert not job["meta_left"]
    assert all(math.isfinite(loss) for loss in job["from_meta"]["losses"])


def test_local_sgd_under_fsdp_is_refused_when_enabled_and_a_no_op_when_disabled(job):
    assert "distributed_type=FSDP" in job["local_sgd"]["refused"]
    assert "enabled=False" in job["local_sgd"]["refused"]
    assert job["local_sgd"]["disabled"] and job["local_sgd"]["steps"] == 1
