"""What Accelerate's shipped test scripts import and assert, tested here on its own.

``nox -s peer`` runs those scripts; these tests pin each piece they rely on: the test_utils
decorators, ``accel.commands.merge``, ``save_fsdp_model``/``load_fsdp_model`` with
``merge_fsdp_weights``, ``AcceleratorState._reset_state()`` keeping the ``PartialState``, the
``join_uneven_inputs`` warnings and the FSDP version chosen from torch's ``ShardingStrategy``.
"""

import unittest

import peer_surface_workers
import pytest
import torch
from torch.distributed.fsdp import ShardingStrategy

import accel.test_utils as test_utils
from accel import FullyShardedDataParallelPlugin
from accel.commands.merge import merge_command_parser
from accel.errors import AcceleratorConfigError
from accel_state.testing import spawn_workers


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("peer_surface")
    return spawn_workers(peer_surface_workers.peer_surface_job, 2, args=(str(folder),), timeout=600)


@pytest.mark.timeout(700)
def test_save_fsdp_model_merges_and_loads_back(results):
    for out in results:
        sharded, full = out["sharded"], out["full"]
        assert sharded["fsdp_version"] == full["fsdp_version"] == 1  # torch's ShardingStrategy
        assert sharded["written"] == "pytorch_model_fsdp_0"
        assert full["written"] == "pytorch_model_fsdp.bin"
        assert sharded["merged_equal"] and sharded["command_equal"]
        assert sharded["loaded_equal"] and full["loaded_equal"]
    assert results[0]["sharded"]["keys"] == results[0]["full"]["keys"] == 4


def test_reset_state_keeps_the_partial_state_and_explains_prepare(results):
    for rank, out in enumerate(results):
        assert out["local_main_after_reset"] is (rank == 0)
        assert out["is_main_after_reset"] is (rank == 0)
        assert "_reset_state()" in out["process_index_after_reset"]
        is_ours, message = out["prepare_after_reset"]  # an AttributeError, and ours
        assert is_ours
        assert "`AcceleratorState` object has no attribute" in message
        assert "This happens if `AcceleratorState._reset_state()`" in message
        assert out["fresh_after_reset"] == 2.0


def test_join_uneven_inputs_warns_for_iterable_loaders_and_non_ddp_jobs(results):
    for out in results:
        assert any("only supported for map-style datasets" in m for m in out["join_warnings"])
        assert any("only supported for multi-GPU" in m for m in out["non_ddp_warning"])
        assert out["type_restored"] == "MULTI_CPU"


def test_sharding_strategy_enum_picks_fsdp1_unless_a_version_is_set():
    enum = FullyShardedDataParallelPlugin(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    assert enum.resolved().fsdp_version == 1
    assert enum.resolved({"fsdp_version": 2}).fsdp_version == 2  # the launcher's choice wins
    named = FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP")
    assert named.resolved().fsdp_version == 2
    explicit = FullyShardedDataParallelPlugin(
        fsdp_version=2, sharding_strategy=ShardingStrategy.FULL_SHARD
    )
    assert explicit.resolved().fsdp_version == 2


class _Layer(torch.nn.Linear):
    pass


def test_set_auto_wrap_policy_checks_the_layer_classes():
    model = torch.nn.Sequential(_Layer(2, 2), torch.nn.ReLU())
    model._no_split_modules = ["_Layer"]
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap")
    plugin.set_auto_wrap_policy(model)
    assert plugin.transformer_cls_names_to_wrap == ["_Layer"]
    wrong = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    with pytest.raises(AcceleratorConfigError, match=r"\['Block'\].*_Layer"):
        wrong.set_auto_wrap_policy(model)
    FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap").set_auto_wrap_policy(model)


def test_merge_command_parser_reads_accelerates_arguments():
    args = merge_command_parser().parse_args(["in", "out", "--unsafe_serialization"])
    assert (args.checkpoint_directory, args.output_path) == ("in", "out")
    assert args.unsafe_serialization and not args.remove_checkpoint_dir


def test_requirement_decorators_skip_with_the_missing_library(monkeypatch):
    monkeypatch.setattr(test_utils.requirements, "is_bnb_available", lambda: False)

    @test_utils.require_bnb
    class Case(unittest.TestCase):
        def test_it(self):
            pass

    assert Case.__unittest_skip__ and "bitsandbytes" in Case.__unittest_skip_why__
    for name in test_utils.__all__:
        if name.startswith("require_"):
            assert callable(getattr(test_utils, name)), name
    assert test_utils.path_in_accelerate_package("test_utils").is_dir()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert test_utils.pytest_xdist_worker_id() == 3
