"""FSDP (FSDP2 and FSDP1) on real gloo processes: parity with DDP, sharding, accumulation, errors."""

from __future__ import annotations

import math
import sys

import fsdp_workers
import pytest
import torch

from accel import Accelerator, AcceleratorConfigError, FullyShardedDataParallelPlugin
from accel_state.testing import spawn_workers

# Hang guards only: on a loaded 2-core machine these multi-process jobs may take minutes.
pytestmark = pytest.mark.timeout(900)


SIZE, STEPS = 8, 3


@pytest.fixture(scope="module")
def parity() -> list[dict]:
    return spawn_workers(fsdp_workers.parity_job, 2, args=(SIZE, STEPS), timeout=600)


def close(got: list[float], want: list[float], tolerance: float = 1e-5) -> bool:
    return all(
        math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
        for a, b in zip(got, want, strict=True)
    )


def test_fsdp2_and_fsdp1_losses_equal_ddp_and_the_one_process_reference(parity):
    reference = fsdp_workers.reference_losses(STEPS, SIZE, 1e-2)
    for rank in parity:
        assert rank["ddp"]["type"] == "MULTI_CPU"
        assert rank["fsdp2"]["type"] == rank["fsdp1"]["type"] == "FSDP"
        # Clipped runs: the same losses and the same global gradient norms as DDP.
        for engine in ("fsdp2", "fsdp1"):
            assert close(rank[engine]["losses"], rank["ddp"]["losses"]), engine
            assert close(rank[engine]["norms"], rank["ddp"]["norms"]), engine
        # Unclipped runs (size-based wrap, CPU offload with activation checkpointing): the
        # plain one-process AdamW on the whole batch.
        for run in ("fsdp2_size", "fsdp2_offload_ac"):
            assert close(rank[run]["losses"], reference), run


def test_each_rank_holds_half_of_the_parameters(parity):
    for rank in parity:
        for run in ("fsdp2", "fsdp1", "fsdp2_size"):
            total = rank[run]["total"]
            assert total == rank["ddp"]["local"]
            assert abs(rank[run]["local"] - total / 2) <= 0.02 * total, run


def test_fsdp2_gathers_as_often_as_fully_shard_by_hand(parity):
    # FULL_SHARD frees each layer's gathered parameters after forward (gathered again in
    # backward), but like torch's default keeps the root's: backward needs them first, so
    # resharding the root would cost an extra all-gather every step.
    for rank in parity:
        gathered = rank["gathered_between_forward_and_backward"]
        assert gathered["by_hand"] == {"root": True, "layer": False}
        assert gathered["full_shard"] == gathered["by_hand"]
        assert gathered["shard_grad_op"] == {"root": True, "layer": True}


def test_gradient_accumulation_equals_the_large_batch_step(parity):
    reference = fsdp_workers.reference_losses(STEPS, SIZE, 1e-2)
    for rank in parity:
        assert close(rank["fsdp2_accumulate"]["losses"], reference)
        assert close(rank["fsdp1_accumulate"]["losses"], reference)


def test_bf16_mixed_precision_trains_close_to_fp32(parity):
    fp32 = fsdp_workers.reference_losses(6, SIZE, 3e-2)
    for rank in parity:
        losses = rank["bf16"]["losses"]
        assert all(math.isfinite(loss) for loss in losses)
        # bf16 compute changes the numbers, not the trajectory.
        assert close(losses, fp32, tolerance=3e-2)
        assert losses != pytest.approx(fp32, abs=1e-6)


def test_misconfigurations_name_the_setting_and_the_fix(parity):
    errors = parity[0]["errors"]
    assert errors["layer"].startswith("AcceleratorConfigError")
    assert "NoSuchLayer" in errors["layer"] and "Block" in errors["layer"]
    assert "fsdp_transformer_layer_cls_to_wrap" in errors["layer"]
    assert "belong to no model prepared with FSDP" in errors["optimizer"]


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"sharding_strategy": "NO_SHARD"}, ["NO_SHARD", "fsdp_version: 1"]),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, ["LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]),
        ({"auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}, ["fsdp_transformer_layer_cls_to_wrap"]),
        ({"fsdp_version": 1, "reshard_after_forward": True}, ["FSDP2 setting"]),
        ({"fsdp_version": 1, "use_orig_params": False}, ["fsdp_use_orig_params"]),
        ({"backward_prefetch": "SOMETIMES"}, ["BACKWARD_PRE"]),
    ],
)
def test_meaningless_combinations_are_refused(settings, words):
    with pytest.raises(AcceleratorConfigError) as caught:
        FullyShardedDataParallelPlugin(**settings).resolved()
    for word in words:
        assert word in str(caught.value)


def test_launcher_keys_map_to_fsdp2_and_fsdp1_settings():
    launcher = {
        "fsdp_sharding_strategy": "SHARD_GRAD_OP",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer,Block",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_offload_params": True,
    }
    fsdp2 = FullyShardedDataParallelPlugin().resolved(launcher)
    assert (fsdp2.fsdp_version, fsdp2.reshard_after_forward) == (2, False)
    assert fsdp2.layer_class_names == ("BertLayer", "Block")
    assert fsdp2.cpu_offload and fsdp2.state_dict_type == "FULL_STATE_DICT"
    fsdp1 = FullyShardedDataParallelPlugin().resolved({**launcher, "fsdp_version": 1})
    assert (fsdp1.fsdp_version, fsdp1.sharding_strategy) == (1, "SHARD_GRAD_OP")
    # The plugin's own fields win over the launcher's.
    mine = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT").resolved(launcher)
    assert mine.state_dict_type == "SHARDED_STATE_DICT"


def test_fsdp_in_a_single_process_starts_a_group_of_one_that_reset_stops():
    import torch.distributed as dist

    from accel_state import reset_state

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert accelerator.distributed_type.value == "FSDP"
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(3, 4)).sum())
    optimizer.step()
    assert type(model).__name__.startswith("FSDP")
    reset_state()
    assert not dist.is_initialized()


@pytest.mark.cuda
def test_world_size_one_fsdp_on_cuda():
    results = spawn_workers(
        fsdp_workers.cuda_job, 1, args=(SIZE, STEPS), timeout=600, use_cpu=False
    )
    assert results[0]["type"] == "FSDP"
    assert close(results[0]["losses"], results[0]["reference"], tolerance=1e-3)


def test_sharded_checkpoints_without_numpy_name_the_install(monkeypatch, tmp_path):
    # torch.distributed.checkpoint's object collectives fail deep inside with "Numpy is not
    # available" on a plain install; the error comes first and names the fix.
    from accel.strategies.fsdp.checkpoint import FSDPModelState

    monkeypatch.setitem(sys.modules, "numpy", None)  # the environment: numpy not installed
    state = FSDPModelState("fsdp_model_0", torch.nn.Linear(2, 2), [])
    for action in (state.save, state.load):
        with pytest.raises(AcceleratorConfigError, match=r"pip install 'accel\[fsdp\]'"):
            action(tmp_path)
