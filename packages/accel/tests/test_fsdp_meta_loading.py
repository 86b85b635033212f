"""cpu_ram_efficient_loading: rank 1 builds its model on ``meta``, FSDP fills it from rank 0.

Real 2-process gloo jobs: after ``prepare`` every rank's shards and buffers are the bits a plain
load (the full model on every rank) gives, and training continues identically, under FSDP2
(sharded on meta, filled by broadcast) and FSDP1 (materialised, then rank 0's values).
"""

from __future__ import annotations

import os

import fsdp_meta_workers
import pytest
import torch

from accel_state.accelerate_env import fsdp_variables, ram_efficient_loading_variables
from accel_state.testing import spawn_workers

pytestmark = [pytest.mark.timeout(900), pytest.mark.torch_feature("fsdp2")]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn_workers(fsdp_meta_workers.meta_job, 2, timeout=600)


def _bit_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize("run", ["fsdp2_meta", "fsdp2_sync_meta", "fsdp1_meta"])
def test_shards_after_prepare_equal_a_plain_load_bit_for_bit(ranks, run):
    plain = run.split("_")[0] + "_plain"
    assert [rank[run]["built_on_meta"] for rank in ranks] == [False, True]
    for rank in ranks:
        assert rank[run]["meta_left"] == []
        _bit_equal(rank[run]["prepared"], rank[plain]["prepared"])
        # The non-persistent buffer (no state dict holds it) is rank 0's on rank 1 too.
        assert torch.equal(rank[run]["position_scale"], rank[plain]["position_scale"])


@pytest.mark.parametrize("run", ["fsdp2_meta", "fsdp2_sync_meta", "fsdp1_meta"])
def test_training_after_a_meta_start_matches_the_plain_run(ranks, run):
    plain = run.split("_")[0] + "_plain"
    for rank in ranks:
        assert rank[run]["losses"] == rank[plain]["losses"]
        _bit_equal(rank[run]["trained"], rank[plain]["trained"])


def test_tied_weights_stay_tied(ranks):
    for rank in ranks:
        for run in ("fsdp2_plain", "fsdp2_meta", "fsdp1_plain", "fsdp1_meta"):
            assert rank[run]["tied"], run


def test_refusals_name_the_problem_and_the_fix(ranks):
    for rank in ranks:
        for run in ("rank0_meta", "rank0_meta_fsdp1"):
            assert "rank 0's model has parameters or buffers on the meta device" in rank[run]
        assert "sync_module_states=False, but ranks [1]" in rank["no_sync"]
        assert "sync_module_states=True" in rank["no_sync"]
        assert "cpu_ram_efficient_loading=True with sync_module_states=False" in rank["config"]


def test_launcher_variables_are_what_transformers_reads():
    env = fsdp_variables({"fsdp_version": 2, "fsdp_cpu_ram_efficient_loading": True})
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    assert env["FSDP_SYNC_MODULE_STATES"] == "true"
    explicit = fsdp_variables(
        {"fsdp_cpu_ram_efficient_loading": "true", "fsdp_sync_module_states": False}
    )
    assert explicit["FSDP_SYNC_MODULE_STATES"] == "false"  # the worker's plugin then refuses it
    assert "FSDP_SYNC_MODULE_STATES" not in fsdp_variables({"fsdp_version": 2})
    assert ram_efficient_loading_variables(False) == {"FSDP_CPU_RAM_EFFICIENT_LOADING": "false"}


def test_the_plugin_exports_the_variables_when_set_in_code(monkeypatch):
    from accel import FullyShardedDataParallelPlugin

    for name in (
        "ACCELERATE_USE_FSDP",
        "FSDP_CPU_RAM_EFFICIENT_LOADING",
        "FSDP_SYNC_MODULE_STATES",
    ):
        monkeypatch.delenv(name, raising=False)
    FullyShardedDataParallelPlugin()  # unset: the launcher's business, nothing exported
    assert "FSDP_CPU_RAM_EFFICIENT_LOADING" not in os.environ
    # monkeypatch restores what the plugin writes.
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("FSDP_SYNC_MODULE_STATES", "false")
    plugin = FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    assert os.environ["FSDP_SYNC_MODULE_STATES"] == "true"
    assert os.environ["ACCELERATE_USE_FSDP"] == "false"  # a value already set is kept
    assert plugin.resolved().cpu_ram_efficient_loading is True


@pytest.fixture(scope="module")
def trainer_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    pytest.importorskip("transformers")
    import fsdp_meta_trainer_workers

    folder = tmp_path_factory.mktemp("tiny_llama")
    fsdp_meta_trainer_workers.save_model(str(folder))
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}
    return spawn_workers(
        fsdp_meta_trainer_workers.trainer_job,
        2,
        args=(str(folder), str(tmp_path_factory.mktemp("trainer_out"))),
        env=env,
        timeout=600,
    )


def test_trainer_with_rank1_on_meta_trains_as_the_plain_run(trainer_ranks):
    assert trainer_ranks[0]["meta"]["loaded_on_meta"] == []
    on_meta = trainer_ranks[1]["meta"]["loaded_on_meta"]
    assert len(on_meta) == trainer_ranks[1]["meta"]["parameters"] > 0
    for rank in trainer_ranks:
        assert rank["meta"]["fsdp_enabled_for_transformers"] is True
        plain, meta = rank["plain"], rank["meta"]
        assert meta["losses"] == plain["losses"] and len(plain["losses"]) == 3
        _bit_equal(meta["weights"], plain["weights"])
        assert torch.equal(meta["inv_freq"], plain["inv_freq"])  # rotary buffer, from rank 0
        assert meta["tied"] and plain["tied"]


def test_trainer_with_from_pretrained_everywhere_trains_as_the_plain_run(trainer_ranks):
    for rank in trainer_ranks:
        plain, loaded = rank["plain"], rank["from_pretrained"]
        assert loaded["losses"] == plain["losses"]
        _bit_equal(loaded["weights"], plain["weights"])
        assert torch.equal(loaded["inv_freq"], plain["inv_freq"])
