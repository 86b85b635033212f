"""Importing folders in the layout Hugging Face Accelerate's save_state writes (1.15.0).

The folder is written here with torch.save and safetensors exactly as Accelerate names and fills
its files (accel's own tests load real Accelerate output, see packages/accel/tests/data).
"""

import logging
import random

import numpy as np
import pytest
import torch
from ckpt_helpers import Counter, fresh_setup, rng_draws, same, snapshot, training_setup
from safetensors.torch import save_file

from accel_ckpt import (
    CheckpointContentsError,
    IncompleteCheckpointError,
    ProjectConfiguration,
    UnsafeCheckpointError,
    is_accelerate_checkpoint,
    load_state,
    read_manifest,
    save_state,
)


def write_accelerate_layout(folder, setup, scaler=None, step=12, with_sampler=True):
    """What accelerate.Accelerator.save_state(folder) writes on one process."""
    folder.mkdir(parents=True)
    first, second = setup["models"]
    save_file(
        {k: v.contiguous() for k, v in first.state_dict().items() if k != "head.weight"},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    torch.save(second.state_dict(), folder / "pytorch_model_1.bin")
    for index, optimizer in enumerate(setup["optimizers"]):
        torch.save(
            optimizer.state_dict(), folder / ("optimizer.bin" if index == 0 else "optimizer_1.bin")
        )
    torch.save(setup["schedulers"][0].state_dict(), folder / "scheduler.bin")
    torch.save(setup["custom_objects"][0].state_dict(), folder / "custom_checkpoint_0.pkl")
    if scaler is not None:
        torch.save(scaler.state_dict(), folder / "scaler.pt")
    if with_sampler:
        torch.save({"epoch": 1}, folder / "sampler.bin")
    torch.save(
        {
            "step": step,
            "random_state": random.getstate(),
            "numpy_random_seed": np.random.get_state(),
            "torch_manual_seed": torch.get_rng_state(),
        },
        folder / "random_states_0.pkl",
    )


class Loader:
    def state_dict(self):
        return {"position": 0}

    def load_state_dict(self, state):
        raise AssertionError("Accelerate's sampler files must not be imported")


def test_an_accelerate_folder_is_refused_without_the_opt_in(tmp_path):
    write_accelerate_layout(tmp_path / "ckpt", training_setup(seed=1))
    assert is_accelerate_checkpoint(tmp_path / "ckpt")
    fresh = fresh_setup()
    before = snapshot(fresh)
    with pytest.raises(UnsafeCheckpointError) as caught:
        load_state(tmp_path / "ckpt", **fresh)
    message = str(caught.value)
    assert "written by Hugging Face Accelerate" in message
    assert "allow_pickle=True" in message and "optimizer.bin" in message
    assert same(snapshot(fresh), before)  # nothing was loaded


def test_an_accelerate_folder_imports_everything_with_allow_pickle(tmp_path, caplog):
    setup = training_setup(seed=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    write_accelerate_layout(tmp_path / "ckpt", setup, scaler=scaler, step=12)
    expected_draws = rng_draws()
    expected = snapshot(setup)
    fresh = fresh_setup()
    fresh_scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    torch.manual_seed(99)
    with caplog.at_level(logging.WARNING, logger="accel_ckpt"):
        loaded = load_state(
            tmp_path / "ckpt",
            **fresh,
            scaler=fresh_scaler,
            dataloaders=[Loader()],
            allow_pickle=True,
        )
    assert rng_draws() == expected_draws
    assert same(snapshot(fresh), expected)
    assert fresh["models"][0].head.weight is fresh["models"][0].embed.weight  # ties kept
    assert fresh_scaler.get_scale() == 512.0
    assert loaded.metadata == {"step": 12}
    assert loaded.manifest.num_processes == 1
    assert loaded.manifest.contents["imported_from"] == "accelerate"
    assert "sampler.bin" in caplog.text and "skip_first_batches" in caplog.text


def test_automatic_naming_resumes_from_the_newest_accelerate_checkpoint(tmp_path):
    config = ProjectConfiguration(tmp_path, automatic_checkpoint_naming=True)
    save_state(**training_setup(seed=1), project_config=config)  # accel: checkpoint_0
    newer = training_setup(seed=4)
    write_accelerate_layout(config.checkpoints_dir / "checkpoint_1", newer, with_sampler=False)
    config = ProjectConfiguration(tmp_path, automatic_checkpoint_naming=True)
    fresh = fresh_setup()
    loaded = load_state(**fresh, project_config=config, allow_pickle=True)
    assert loaded.path.name == "checkpoint_1"
    assert same(snapshot(fresh), snapshot(newer))
    assert config.iteration == 2
    path = save_state(**fresh, project_config=config)  # the next save is accel's own format
    assert path.name == "checkpoint_2" and read_manifest(path).metadata == {}


def test_a_missing_file_is_named(tmp_path):
    write_accelerate_layout(tmp_path / "ckpt", training_setup(seed=1))
    (tmp_path / "ckpt" / "optimizer_1.bin").unlink()
    with pytest.raises(CheckpointContentsError, match=r"no optimizer_1\.bin.*optimizer 1"):
        load_state(tmp_path / "ckpt", **fresh_setup(), allow_pickle=True)
    with pytest.raises(CheckpointContentsError, match=r"custom_checkpoint_1\.pkl"):
        load_state(tmp_path / "ckpt", custom_objects=[Counter(), Counter()], allow_pickle=True)


def test_other_folders_without_a_manifest_stay_incomplete(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.safetensors").write_bytes(b"")
    assert not is_accelerate_checkpoint(tmp_path / "half")
    with pytest.raises(IncompleteCheckpointError, match=r"accel_manifest\.json is missing"):
        load_state(tmp_path / "half", allow_pickle=True)
