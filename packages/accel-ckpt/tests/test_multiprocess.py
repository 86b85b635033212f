"""Two real processes in a gloo group (one spawn: each costs seconds)."""

import pytest
from ckpt_workers import per_rank_folders, refuses_unwritable_tensors, round_trips

from accel_state.testing import spawn_workers
from accel_state.torch_compat import group_free_releases_gil


def test_two_processes_save_and_load_everything(tmp_path):
    results = spawn_workers(round_trips, 2, args=(str(tmp_path),), timeout=150)
    for rank, out in enumerate(results):
        assert out["rank"] == rank
        assert out["bitwise"], out
        assert out["rng_restored"], out
        assert out["loaders"] == [(5, 1), (10 + rank, rank)]
        assert out["async_path"] == str(tmp_path / "async")
        assert out["async_files"] == [
            "accel_manifest.json",
            "model.safetensors",
            "random_states_0.safetensors",
            "random_states_1.safetensors",
        ]
        assert out["kept"] == ["checkpoint_1", "checkpoint_2"]
        assert out["latest"] == "checkpoint_2"
        assert out["model_loaded"]
        assert out["per_node_files"] == [
            "accel_manifest.json",
            "model.safetensors",
            "random_states_0.safetensors",
            "random_states_1.safetensors",
        ]
        assert out["leftovers"] == []
        assert out["sharded_contents"] == {"shards": ["shards/part_0.pt", "shards/part_1.pt"]}
        assert out["sharded_restored"] == [float(rank)] * 4
        # Every file of the DCP state is in the manifest with the size and CRC-32 on disk; the
        # data files were hashed by the ranks that wrote them, .metadata by rank 0.
        assert out["dcp_manifest"] == out["dcp_on_disk"]
        assert out["dcp_contents"] == sorted(out["dcp_on_disk"])
        assert f"__{rank}_0.distcp" in out["dcp_reported"]
        assert (".metadata" in out["dcp_reported"]) == (rank == 0)
        assert out["dcp_restored"]
        # Freed once stopped; on torch < 2.9 kept for the process's life (torch_compat).
        assert out["groups_alive_after_stop"] == [not group_free_releases_gil()] * 2
    first, second = results
    reported = {f"dcp/{name}" for out in results for name in out["dcp_reported"]}
    assert reported == set(first["dcp_on_disk"])  # nothing left for rank 0 to read back
    assert (
        first["files"]
        == second["files"]
        == [
            "accel_manifest.json",
            "custom_checkpoint_0.safetensors",
            "dataloader.safetensors",
            "dataloader_1_rank0.safetensors",
            "dataloader_1_rank1.safetensors",
            "model.safetensors",
            "model_1.safetensors",
            "optimizer.safetensors",
            "optimizer_1.safetensors",
            "random_states_0.safetensors",
            "random_states_1.safetensors",
            "scheduler.safetensors",
        ]
    )
    assert first["contents"]["dataloaders"] == [
        {"shared": "dataloader.safetensors"},
        {
            "per_rank": {
                "0": "dataloader_1_rank0.safetensors",
                "1": "dataloader_1_rank1.safetensors",
            }
        },
    ]
    assert first["model_files_written"] > 2 and second["model_files_written"] == 0
    assert first["failure"].startswith("RuntimeError: state_dict exploded")
    assert second["failure"].startswith("DistributedCheckpointError")
    assert "rank 0: RuntimeError: state_dict exploded on purpose" in second["failure"]


@pytest.mark.parametrize(
    "folders",
    [["rank0", "rank1"], ["pair", "pair", "alone"]],
    ids=["one-folder-per-rank", "two-ranks-share-one"],
)
def test_each_rank_saves_and_loads_its_own_folder(tmp_path, folders):
    results = spawn_workers(
        per_rank_folders, len(folders), args=(str(tmp_path), folders), timeout=150
    )
    for rank, out in enumerate(results):
        sharing = [other for other, name in enumerate(folders) if name == folders[rank]]
        assert out["path"] == str(tmp_path / folders[rank])
        assert out["restored"] and out["rng_restored"], out
        assert out["loaders"] == [(4, 9), (20 + rank, rank)]
        assert out["random_states"] == [str(other) for other in sharing]
        own_loader = (
            [f"dataloader_1_rank{other}.safetensors" for other in sharing]
            if len(folders) > 1
            else []
        )
        assert out["files"] == sorted(
            [
                "accel_manifest.json",
                "custom_checkpoint_0.safetensors",
                "dataloader.safetensors",
                *own_loader,
                "model.safetensors",
                "model_1.safetensors",
                "optimizer.safetensors",
                "optimizer_1.safetensors",
                *[f"random_states_{other}.safetensors" for other in sharing],
                "scheduler.safetensors",
            ]
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(folders))


@pytest.mark.torch_feature("fsdp2")
def test_unwritable_tensors_are_refused_on_every_rank_and_the_last_checkpoint_stays(tmp_path):
    # A hang guard: on a loaded 2-core machine the spawned processes may take minutes.
    results = spawn_workers(refuses_unwritable_tensors, 2, args=(str(tmp_path),), timeout=600)
    for rank, out in enumerate(results):
        for kind, words in (("dtensor", "DTensor"), ("meta", "meta device")):
            # The direct writers name the key (or its path in the pickled object) and the type.
            assert out[f"safetensors_{kind}"].startswith(
                "InvalidArgumentError: tensor 'layer.weight'"
            )
            assert words in out[f"safetensors_{kind}"]
            assert out[f"pickle_{kind}"].startswith("InvalidArgumentError: ")
            assert ".state.0.exp_avg" in out[f"pickle_{kind}"] and words in out[f"pickle_{kind}"]
            assert out[f"{kind}_files_left"] == []  # refused before the file was created
            # save_state: rank 0 names its object's key; rank 1 is told rank 0 failed.
            message = out[f"save_state_{kind}"]
            if rank == 0:
                assert message.startswith("InvalidArgumentError: custom object 0: moments.exp_avg")
            else:
                assert message.startswith("DistributedCheckpointError: ") and "rank 0" in message
            assert words in message
        assert "'weight'" in out["save_state_meta_model"] and "meta" in out["save_state_meta_model"]
        assert out["checkpoints"] == ["checkpoint_0"]  # no staging folder, nothing published
        assert out["latest"] == "checkpoint_0"
        assert out["latest_loads"]


@pytest.mark.timeout(300)
@pytest.mark.torch_feature("fsdp2")
def test_full_checkpoints_load_into_shards_and_from_rank0_only(tmp_path):
    from ckpt_workers import loads_full_checkpoints_into_shards

    results = spawn_workers(
        loads_full_checkpoints_into_shards, 2, args=(str(tmp_path),), timeout=240
    )
    for result in results:
        assert result["plain_ok"], "broadcast_from_rank0: rank 1 did not get rank 0's weights"
        assert result["missing"] == [] and result["unexpected"] == []
        assert result["is_dtensor"] and result["sharded_ok"]


def test_broadcast_from_rank0_without_a_process_group_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from accel_ckpt import load_checkpoint_in_model
    from accel_ckpt.errors import InvalidArgumentError

    model = torch.nn.Linear(2, 2)
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    with pytest.raises(InvalidArgumentError, match=r"broadcast_from_rank0=True\) needs"):
        load_checkpoint_in_model(model, tmp_path, broadcast_from_rank0=True)
