"""Weights & Biases (offline) and MLflow (local file store) trackers write their real files."""

import json
import struct
import subprocess
import sys

import pytest
import torch

from accel import Accelerator, LoggerType
from accel.errors import UnsupportedFeatureError
from accel.tracking import LOGGER_TYPE_TO_CLASS, resolve_trackers, tracker_package_available
from accel_state.testing import spawn_workers

needs_wandb = pytest.mark.skipif(
    not tracker_package_available("wandb"), reason="needs the wandb extra"
)
needs_mlflow = pytest.mark.skipif(
    not tracker_package_available("mlflow"), reason="needs the mlflow extra"
)


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    """W&B offline with every folder under tmp_path; MLflow allowed a local file store."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        folder = tmp_path / name.lower()
        folder.mkdir()
        monkeypatch.setenv(name, str(folder))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path
    if tracker_package_available("wandb") and "wandb" in sys.modules:
        sys.modules["wandb"].teardown()  # stop this process's wandb service


def wandb_records(run_file):
    """Decode a ``run-*.wandb`` file (W&B's record log) into its protobuf records."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    block, position, pieces, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            position += left
            continue
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
    return records


def wandb_run_contents(folder):
    """(project, config, history rows) of the single offline run under ``folder``."""
    runs = list(folder.glob("wandb/offline-run-*"))
    assert len(runs) == 1, runs
    (run_file,) = runs[0].glob("run-*.wandb")
    project, config, history = None, {}, []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            project = record.run.project
            updates = record.run.config.update
        elif kind == "config":
            updates = record.config.update
        elif kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
            continue
        else:
            continue
        config.update({item.key: json.loads(item.value_json) for item in updates})
    return project, config, history


def mlflow_store_contents(store, experiment):
    """(run names, params, metrics) of the runs of ``experiment`` in a file store."""
    experiments = [
        meta.parent
        for meta in store.glob("*/meta.yaml")
        if f"name: {experiment}\n" in meta.read_text()
    ]
    assert len(experiments) == 1, experiments
    runs = [meta.parent for meta in experiments[0].glob("*/meta.yaml")]
    results = []
    for run in runs:
        params = {path.name: path.read_text() for path in (run / "params").iterdir()}
        metrics = {
            path.name: [tuple(line.split()[1:]) for line in path.read_text().splitlines()]
            for path in (run / "metrics").iterdir()
        }
        tags = {path.name: path.read_text() for path in (run / "tags").iterdir()}
        results.append((tags.get("mlflow.runName"), params, metrics, tags))
    return results


@needs_wandb
def test_wandb_offline_run_holds_config_and_history(tracker_env):
    import wandb

    accelerator = Accelerator(cpu=True, log_with=LoggerType.WANDB)
    accelerator.init_trackers(
        "accel-project",
        config={"lr": 0.1, "layers": 2},
        init_kwargs={"wandb": {"dir": str(tracker_env), "name": "first"}},
    )
    run = accelerator.get_tracker("wandb", unwrap=True)
    assert isinstance(run, wandb.Run) and run.name == "first"
    accelerator.log({"loss": torch.tensor(0.5), "acc": 0.75}, step=3)
    accelerator.log({"loss": 0.25}, step=4)
    accelerator.end_training()
    wandb.teardown()  # the wandb service writes the run file when it stops
    project, config, history = wandb_run_contents(tracker_env)
    assert project == "accel-project"
    assert config["lr"] == 0.1 and config["layers"] == 2
    assert [(row["_step"], row["loss"]) for row in history] == [(3, 0.5), (4, 0.25)]
    assert history[0]["acc"] == 0.75


@needs_mlflow
def test_mlflow_file_store_holds_params_and_metrics(tracker_env):
    store = tracker_env / "mlruns"
    accelerator = Accelerator(cpu=True, log_with="mlflow")
    accelerator.init_trackers(
        "accel-experiment",
        config={"lr": 0.1, "optimizer": "adam"},
        init_kwargs={
            "mlflow": {"logging_dir": str(store), "run_name": "first", "tags": {"k": "v"}}
        },
    )
    assert accelerator.get_tracker("mlflow", unwrap=True).info.run_name == "first"
    accelerator.log({"loss": torch.tensor(0.5), "note": "not a number"}, step=3)
    accelerator.log({"loss": 0.25}, step=4)
    notes = tracker_env / "notes.txt"
    notes.write_text("kept with the run")
    accelerator.get_tracker("mlflow").log_artifact(notes)
    accelerator.end_training()
    ((name, params, metrics, tags),) = mlflow_store_contents(store, "accel-experiment")
    (artifact,) = store.glob("*/*/artifacts/notes.txt")
    assert artifact.read_text() == "kept with the run"
    assert name == "first" and tags["k"] == "v"
    assert params == {"lr": "0.1", "optimizer": "adam"}
    assert set(metrics) == {"loss"}
    assert [(float(value), int(step)) for value, step in metrics["loss"]] == [(0.5, 3), (0.25, 4)]


def test_other_accelerate_tracker_names_say_what_to_do(monkeypatch):
    assert {t.value for t in LoggerType} >= {
        "wandb",
        "mlflow",
        "comet_ml",
        "aim",
        "clearml",
        "dvclive",
        "swanlab",
        "trackio",
    }
    for name in ("comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio"):
        monkeypatch.setitem(sys.modules, name, None)  # make sure the package counts as absent
        with pytest.raises(UnsupportedFeatureError, match=f"pip install {name}"):
            resolve_trackers(name)
        # The class imports without its package and says what to install when created.
        with pytest.raises(UnsupportedFeatureError, match=f"pip install {name}"):
            LOGGER_TYPE_TO_CLASS[name]("run")
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(UnsupportedFeatureError, match=r"pip install 'accel\[wandb\]'"):
        Accelerator(cpu=True, log_with="wandb")
    with pytest.raises(UnsupportedFeatureError, match=r"pip install 'accel\[mlflow\]'"):
        resolve_trackers(LoggerType.MLFLOW)
    assert "wandb" not in resolve_trackers("all") and "mlflow" not in resolve_trackers("all")


def test_import_accel_imports_no_tracker_package():
    code = (
        "import sys, accel, accel.tracking, accel.utils\n"
        "accel.Accelerator, accel.tracking.LoggerType.WANDB\n"
        "loaded = [m for m in ('wandb', 'mlflow') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert accel.tracking.WandBTracker.name == 'wandb'\n"
        "assert accel.tracking.MLflowTracker.name == 'mlflow'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _log_on_two_processes(directory: str, names: list[str]) -> None:
    accelerator = Accelerator(log_with=names, project_dir=directory)
    accelerator.init_trackers(
        "shared",
        config={"ranks": accelerator.num_processes},
        init_kwargs={"wandb": {"dir": directory}, "mlflow": {"logging_dir": f"{directory}/mlruns"}},
    )
    accelerator.log({"rank": accelerator.process_index}, step=accelerator.process_index)
    assert (accelerator.get_tracker("jsonl") is None) == (accelerator.process_index != 0)
    accelerator.end_training()


def test_only_the_main_process_writes(tracker_env):
    """One 2-process job: jsonl, and wandb and mlflow where installed, write rank 0's values only."""
    names = ["jsonl"] + [n for n in ("wandb", "mlflow") if tracker_package_available(n)]
    spawn_workers(_log_on_two_processes, 2, args=(str(tracker_env), names), timeout=240)
    lines = (tracker_env / "shared" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["rank"] for line in lines] == [0]
    if "wandb" in names:
        project, config, history = wandb_run_contents(tracker_env)
        assert project == "shared" and config["ranks"] == 2
        assert [(row["_step"], row["rank"]) for row in history] == [(0, 0)]
    if "mlflow" in names:
        ((_, params, metrics, _),) = mlflow_store_contents(tracker_env / "mlruns", "shared")
        assert params == {"ranks": "2"}
        assert [(float(v), int(s)) for v, s in metrics["rank"]] == [(0.0, 0)]
