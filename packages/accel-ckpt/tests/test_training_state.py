import json
import random
import re
import zlib

import numpy as np
import pytest
import torch
from ckpt_helpers import LoaderState, fresh_setup, rng_draws, same, snapshot, training_setup

from accel_ckpt import (
    MANIFEST_NAME,
    AsyncSaveError,
    CheckpointContentsError,
    Checkpointer,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    InvalidArgumentError,
    PathEscapeError,
    ProjectConfiguration,
    UnsupportedValueError,
    file_jobs,
    load_state,
    read_manifest,
    save_state,
    verify_checkpoint,
)
from accel_ckpt.checksum import FileRecord


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_full_round_trip_is_bitwise(tmp_path):
    setup = training_setup(seed=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    loader = LoaderState(position=7, seed=3)
    expected = snapshot(setup)
    seed_all(5)
    path = save_state(
        tmp_path / "ckpt", **setup, scaler=scaler, dataloaders=[loader], metadata={"step": 12}
    )
    after_save = rng_draws()
    assert sorted(p.name for p in path.iterdir()) == [
        MANIFEST_NAME,
        "custom_checkpoint_0.safetensors",
        "dataloader.safetensors",
        "model.safetensors",
        "model_1.safetensors",
        "optimizer.safetensors",
        "optimizer_1.safetensors",
        "random_states_0.safetensors",
        "scaler.safetensors",
        "scheduler.safetensors",
    ]
    seed_all(99)
    target = fresh_setup()
    new_scaler, new_loader = torch.amp.GradScaler("cpu"), LoaderState()
    loaded = load_state(path, **target, scaler=new_scaler, dataloaders=[new_loader])
    assert rng_draws() == after_save
    assert loaded.metadata == {"step": 12}
    for kind in ("models", "optimizers", "schedulers", "custom_objects"):
        for want, got in zip(expected[kind], target[kind], strict=True):
            assert same(got.state_dict(), want), kind
    assert target["models"][0].head.weight is target["models"][0].embed.weight
    assert same(new_scaler.state_dict(), scaler.state_dict())
    assert (new_loader.position, new_loader.seed) == (7, 3)
    # The restored optimizer keeps training exactly like the original.
    from ckpt_helpers import train

    train(setup["models"][0], setup["optimizers"][0], seed=8)
    train(target["models"][0], target["optimizers"][0], seed=8)
    assert same(setup["models"][0].state_dict(), target["models"][0].state_dict())


def test_bin_models_and_pickled_custom_objects_are_opt_in(tmp_path):
    setup = training_setup(seed=2)

    class Opaque:
        def __init__(self):
            self.value = {"when": np.datetime64("2024-01-01")}

        def state_dict(self):
            return self.value

        def load_state_dict(self, state):
            self.value = state

    with pytest.raises(UnsupportedValueError, match="custom object 0"):
        save_state(tmp_path / "a", custom_objects=[Opaque()])
    assert not tmp_path.joinpath("a").exists()
    assert not list(tmp_path.iterdir())  # the temporary folder is gone too
    path = save_state(
        tmp_path / "b",
        models=setup["models"],
        custom_objects=[Opaque()],
        safe_serialization=False,
        allow_pickle=True,
    )
    assert {"pytorch_model.bin", "pytorch_model_1.bin", "custom_checkpoint_0.pkl"} <= {
        p.name for p in path.iterdir()
    }
    target = fresh_setup()
    restored = Opaque()
    restored.value = None
    load_state(path, models=target["models"], custom_objects=[restored], allow_pickle=True)
    assert restored.value == {"when": np.datetime64("2024-01-01")}
    assert same(target["models"][1].state_dict(), setup["models"][1].state_dict())


def test_project_configuration_naming_and_total_limit(tmp_path):
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    assert config.logging_dir == str(tmp_path)
    setups = []
    for seed in range(4):
        setup = training_setup(seed)
        setups.append(snapshot(setup))
        path = save_state(models=setup["models"], project_config=config)
        assert path == tmp_path / "checkpoints" / f"checkpoint_{seed}"
    assert config.iteration == 4
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "checkpoint_2",
        "checkpoint_3",
    ]
    # An unfinished newer checkpoint is never picked.
    (tmp_path / "checkpoints" / "checkpoint_9").mkdir()
    fresh_config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    target = fresh_setup()
    loaded = load_state(models=target["models"], project_config=fresh_config)
    assert loaded.path.name == "checkpoint_3"
    assert fresh_config.iteration == 4
    assert same(target["models"][0].state_dict(), setups[3]["models"][0])
    config.iteration = 3
    with pytest.raises(CheckpointExistsError, match="checkpoint_3 already exists"):
        save_state(models=target["models"], project_config=config)


def test_overwrite_is_atomic_and_foreign_folders_are_refused(tmp_path):
    first, second = training_setup(1), training_setup(2)
    save_state(tmp_path / "ckpt", models=first["models"])
    save_state(tmp_path / "ckpt", models=second["models"][:1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    target = fresh_setup()
    load_state(tmp_path / "ckpt", models=target["models"][:1])
    assert same(target["models"][0].state_dict(), second["models"][0].state_dict())
    with pytest.raises(CheckpointContentsError, match="holds 1 models"):
        load_state(tmp_path / "ckpt", models=target["models"])
    foreign = tmp_path / "outputs"
    foreign.mkdir()
    (foreign / "log.txt").write_text("keep me")
    with pytest.raises(CheckpointExistsError, match="not an accel checkpoint"):
        save_state(foreign, models=first["models"])
    assert (foreign / "log.txt").read_text() == "keep me"


def test_incomplete_and_corrupt_checkpoints_name_the_file(tmp_path):
    setup = training_setup(3)
    path = save_state(tmp_path / "ckpt", **setup)
    target = fresh_setup()
    with pytest.raises(CheckpointNotFoundError, match="nowhere"):
        load_state(tmp_path / "nowhere", **target)
    data = bytearray((path / "optimizer.safetensors").read_bytes())
    data[-1] ^= 1
    (path / "optimizer.safetensors").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.safetensors: its CRC-32"):
        load_state(path, **target)
    (path / "optimizer.safetensors").write_bytes(bytes(data[:-5]))
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.safetensors is \d+ bytes but"):
        load_state(path, **target)
    (path / "scheduler.safetensors").unlink()
    (path / "optimizer.safetensors").write_bytes(bytes(data))
    with pytest.raises(IncompleteCheckpointError, match=r"scheduler\.safetensors is missing"):
        load_state(path, **target)
    (path / MANIFEST_NAME).unlink()
    with pytest.raises(IncompleteCheckpointError, match=f"{MANIFEST_NAME} is missing"):
        load_state(path, **target)


def test_hooks_and_checkpointer(tmp_path):
    setup = training_setup(4)
    calls = []

    def save_hook(models, weights, folder):
        calls.append(("save", len(models), folder))
        weights.pop(1)  # this model is saved by the hook itself
        torch.save({"custom": 1}, f"{folder}/extra.pt")

    def load_hook(models, folder):
        calls.append(("load", len(models), folder))
        models.pop(1)

    ckpt = Checkpointer(
        ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    )
    ckpt.register_for_checkpointing(*setup["custom_objects"])
    handle = ckpt.register_save_state_pre_hook(save_hook)
    ckpt.register_load_state_pre_hook(load_hook)
    path = ckpt.save_state(models=setup["models"], optimizers=setup["optimizers"])
    names = {p.name for p in path.iterdir()}
    assert "extra.pt" in names and "model_1.safetensors" not in names
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["contents"]["extra_files"] == ["extra.pt"]
    assert ".accel-tmp-" in calls[0][2]  # hooks write into the folder being committed
    target = fresh_setup()
    ckpt.custom_objects[:] = target["custom_objects"]
    ckpt.load_state(models=target["models"], optimizers=target["optimizers"])
    assert calls[1] == ("load", 2, str(path))
    assert same(target["models"][0].state_dict(), setup["models"][0].state_dict())
    assert same(target["custom_objects"][0].state_dict(), setup["custom_objects"][0].state_dict())
    handle.remove()
    second = ckpt.save_state(models=setup["models"])
    assert (second / "model_1.safetensors").exists()


def test_async_save_snapshots_and_commits(tmp_path):
    setup = training_setup(5)
    expected = snapshot(setup)
    handle = save_state(tmp_path / "ckpt", **setup, blocking=False)
    with torch.no_grad():  # training goes on while the files are written
        for parameter in setup["models"][0].parameters():
            parameter.add_(1.0)
    assert handle.wait() == tmp_path / "ckpt"
    assert handle.done() and "committed" in repr(handle)
    target = fresh_setup()
    load_state(tmp_path / "ckpt", **target)
    assert same(target["models"][0].state_dict(), expected["models"][0])
    assert same(target["optimizers"][0].state_dict(), expected["optimizers"][0])


def test_async_errors_surface_on_wait_and_on_next_save(tmp_path, monkeypatch):
    setup = training_setup(6)
    save_state(tmp_path / "ckpt", models=setup["models"])
    real_write = file_jobs.FileJob.write

    def failing_write(self, folder):
        if self.category == "optimizers":
            raise OSError(28, "No space left on device")
        return real_write(self, folder)

    monkeypatch.setattr(file_jobs.FileJob, "write", failing_write)
    handle = save_state(tmp_path / "ckpt", **setup, blocking=False)
    with pytest.raises(AsyncSaveError, match="No space left on device") as info:
        handle.wait()
    assert isinstance(info.value.__cause__, OSError)
    save_state(tmp_path / "other", **setup, blocking=False)
    with pytest.raises(AsyncSaveError, match="other"):
        save_state(tmp_path / "third", models=setup["models"])
    monkeypatch.setattr(file_jobs.FileJob, "write", real_write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no partial folder anywhere
    target = fresh_setup()
    load_state(tmp_path / "ckpt", models=target["models"])  # the previous checkpoint is intact
    assert same(target["models"][1].state_dict(), setup["models"][1].state_dict())


class _FileState:
    """A sharded state writing one file; ``fail`` makes its save raise midway."""

    def __init__(self, name: str, value: int, fail: bool = False) -> None:
        self.name = name
        self.value = value
        self.fail = fail

    def save(self, folder):
        (folder / "part.json").write_text(json.dumps(self.value))
        if self.fail:
            raise OSError("disk full while writing shards")

    def load(self, folder):
        self.value = json.loads((folder / "part.json").read_text())


class _ReportingState(_FileState):
    """A sharded state that reports what it wrote (``report`` overrides the true record)."""

    def __init__(self, name: str, value: int, report: object = None) -> None:
        super().__init__(name, value)
        self.report = report

    def save(self, folder):
        super().save(folder)
        (folder / "extra.bin").write_bytes(b"not reported")
        data = (folder / "part.json").read_bytes()
        true = {"part.json": (len(data), zlib.crc32(data))}
        return true if self.report is None else self.report


def test_sharded_states_may_report_their_files_size_and_checksum(tmp_path):
    path = save_state(tmp_path / "ckpt", sharded_states=[_ReportingState("s", 12345)])
    manifest = read_manifest(path)
    data = (path / "s" / "part.json").read_bytes()
    assert manifest.files["s/part.json"] == FileRecord(len(data), zlib.crc32(data))
    assert manifest.files["s/extra.bin"] == FileRecord(12, zlib.crc32(b"not reported"))
    assert sorted(manifest.contents["sharded_states"]["s"]) == ["s/extra.bin", "s/part.json"]
    state = _FileState("s", 0)
    load_state(path, sharded_states=[state])
    assert state.value == 12345
    assert verify_checkpoint(path).files == manifest.files

    # A damaged byte of the same size: load_state (sizes only for sharded files) cannot tell;
    # verify_checkpoint reads every file and names the damaged one.
    part = path / "s" / "part.json"
    part.write_bytes(part.read_bytes().replace(b"5", b"6"))
    with pytest.raises(
        CorruptCheckpointError,
        match=r"s/part\.json: size/CRC-32 5/\w{8} differ from the manifest's 5/",
    ):
        verify_checkpoint(path)
    (path / "s" / "extra.bin").unlink()
    with pytest.raises(IncompleteCheckpointError, match=r"extra\.bin is missing"):
        verify_checkpoint(path)


@pytest.mark.parametrize(
    ("report", "error", "words"),
    [
        (["part.json"], InvalidArgumentError, "save() returned list"),
        ({"../part.json": (5, 0)}, PathEscapeError, "climbs out of the folder"),
        ({"/abs/part.json": (5, 0)}, PathEscapeError, "an absolute path"),
        ({"part.json": "5 bytes"}, InvalidArgumentError, "(size, crc32) pair"),
        (
            {"part.json": (999, 0)},
            InvalidArgumentError,
            "reported s/part.json with 999 bytes, but the file has 5",
        ),
        (
            {"missing.bin": (3, 0)},
            InvalidArgumentError,
            "s/missing.bin with 3 bytes, but the file does not exist",
        ),
    ],
)
def test_a_wrong_report_from_a_sharded_state_is_refused(tmp_path, report, error, words):
    with pytest.raises(error, match=re.escape(words)):
        save_state(tmp_path / "ckpt", sharded_states=[_ReportingState("s", 12345, report)])
    assert list(tmp_path.iterdir()) == []  # nothing published, no temporary folder left


def test_sharded_states_are_written_inside_the_atomic_folder(tmp_path):
    setup = training_setup(seed=3)
    path = save_state(
        tmp_path / "ckpt", models=setup["models"], sharded_states=[_FileState("s", 5)]
    )
    contents = read_manifest(path).contents
    assert contents["sharded_states"] == {"s": ["s/part.json"]}
    assert "s/part.json" in read_manifest(path).files  # size and CRC verified on load
    state = _FileState("s", 0)
    load_state(path, models=fresh_setup()["models"], sharded_states=[state])
    assert state.value == 5

    # A failing sharded save leaves the previous checkpoint in place, untouched.
    with pytest.raises(OSError, match="disk full"):
        save_state(tmp_path / "ckpt", sharded_states=[_FileState("s", 9, fail=True)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    state = _FileState("s", 0)
    load_state(path, models=fresh_setup()["models"], sharded_states=[state])
    assert state.value == 5

    with pytest.raises(CheckpointContentsError, match="no sharded state named 'other'"):
        load_state(path, sharded_states=[_FileState("other", 0)])
    with pytest.raises(InvalidArgumentError, match="used twice"):
        save_state(tmp_path / "b", sharded_states=[_FileState("s", 1), _FileState("s", 2)])
    with pytest.raises(InvalidArgumentError, match="plain folder name"):
        save_state(tmp_path / "b", sharded_states=[_FileState("../up", 1)])
    with pytest.raises(InvalidArgumentError, match=r"sharded_states\[0\] \(int\)"):
        save_state(tmp_path / "b", sharded_states=[3])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="one shared folder"):
        save_state(tmp_path / "b", sharded_states=[_FileState("s", 1)], save_on_each_node=True)


def test_register_for_checkpointing_names_each_invalid_item_by_index():
    # Accelerate's message, which its tests assert: "Item at index N" for each invalid object.
    model = torch.nn.Linear(2, 2)
    with pytest.raises(InvalidArgumentError) as error:
        Checkpointer().register_for_checkpointing(torch.ones(1), torch.ones(2), model)
    message = str(error.value)
    assert "Item at index 0, `Tensor`" in message and "Item at index 1" in message
    assert "Item at index 2" not in message and "state_dict" in message
