import os

import pytest
from ckpt_helpers import fresh_setup, same, training_setup

from accel_ckpt import ProjectConfiguration, atomic, latest_checkpoint, load_state, save_state
from accel_ckpt.atomic import atomic_file, publish_dir, sibling


def test_atomic_file_keeps_the_old_file_on_error(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(target) as temporary:
        temporary.write_text("half")
        raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]
    with atomic_file(target) as temporary:
        temporary.write_text("new")
    assert target.read_text() == "new"


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_replaces_a_folder(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "_renameat2_exchange", lambda a, b: False)
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "a").write_text("old")
    staged = sibling(final, "accel-tmp", "x")
    staged.mkdir()
    (staged / "a").write_text("new")
    publish_dir(staged, final)
    assert (final / "a").read_text() == "new"
    assert os.listdir(tmp_path) == ["ckpt"]


def test_a_crash_between_the_two_renames_is_recovered(tmp_path, monkeypatch):
    """Without renameat2 a replacement is two renames; dying between them hides the old one."""
    first, second = training_setup(1), training_setup(2)
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    save_state(models=first["models"], project_config=config)
    final = tmp_path / "checkpoints" / "checkpoint_0"
    os.rename(final, sibling(final, atomic.OLD_TAG, "dead"))  # state right after the first rename
    assert latest_checkpoint(tmp_path / "checkpoints") == sibling(final, atomic.OLD_TAG, "dead")
    target = fresh_setup()
    load_state(final, models=target["models"])
    assert same(target["models"][0].state_dict(), first["models"][0].state_dict())
    load_state(models=target["models"], project_config=config)
    assert config.iteration == 1
    monkeypatch.setattr(atomic, "_renameat2_exchange", lambda a, b: False)
    save_state(final, models=second["models"])  # recovery, then a normal replacement
    assert sorted(os.listdir(final.parent)) == ["checkpoint_0"]
    load_state(final, models=target["models"])
    assert same(target["models"][1].state_dict(), second["models"][1].state_dict())


def test_leftover_temporary_folders_are_ignored_and_cleaned(tmp_path):
    setup = training_setup(3)
    final = tmp_path / "ckpt"
    save_state(final, models=setup["models"])
    leftover = sibling(final, atomic.TMP_TAG, "dead")
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    target = fresh_setup()
    load_state(final, models=target["models"])
    save_state(final, models=setup["models"])
    assert os.listdir(tmp_path) == ["ckpt"]
