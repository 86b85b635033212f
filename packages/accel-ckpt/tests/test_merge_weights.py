"""merge-weights: a torch.distributed.checkpoint model state becomes plain safetensors files."""

from __future__ import annotations

import argparse

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict_saver import save

from accel_ckpt import CheckpointNotFoundError, load_checkpoint_in_model
from accel_ckpt.cli import register_merge_weights
from accel_ckpt.merge_weights import merge_weights
from accel_state.torch_compat import local_dcp_options


def test_merge_writes_the_model_entries_only_sharded_with_an_index(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    folder = tmp_path / "checkpoint_0" / "fsdp_model_0"
    state = {"model": model.state_dict(), "optimizer": {"state": {"0.weight": torch.ones(3)}}}
    save(state, checkpoint_id=folder, **local_dcp_options())
    written = merge_weights(tmp_path / "checkpoint_0", tmp_path / "merged", max_shard_size="400B")
    assert (tmp_path / "merged" / "model.safetensors.index.json") in written
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    load_checkpoint_in_model(plain, tmp_path / "merged")
    for name, tensor in model.state_dict().items():
        assert torch.equal(plain.state_dict()[name], tensor), name
    # One folder given directly works too.
    merge_weights(folder, tmp_path / "single")
    assert sorted(load_file(str(tmp_path / "single" / "model.safetensors"))) == sorted(
        model.state_dict()
    )


def test_cli_parser_and_a_folder_without_shards(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register_merge_weights(parser.add_subparsers())
    args = parser.parse_args(["merge-weights", str(tmp_path), str(tmp_path / "out")])
    assert args.handler(args) == 1
    assert "holds no sharded model state" in capsys.readouterr().err
    with pytest.raises(CheckpointNotFoundError, match="is not a folder"):
        merge_weights(tmp_path / "missing", tmp_path / "out")
