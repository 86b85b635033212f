"""Trackers write what was logged, only on the main process; logging and progress helpers."""

import csv
import json
import logging

import pytest
import torch

from accel import Accelerator, AcceleratorConfigError, GeneralTracker, tracking
from accel.logging import get_logger
from accel.tracking import registry, resolve_trackers, tensorboard_available
from accel.utils import find_executable_batch_size, tqdm
from accel_state.testing import spawn_workers


class RecordingTracker(GeneralTracker):
    name = "recording"

    def __init__(self):
        self.config = None
        self.records = []
        self.finished = False

    def store_init_configuration(self, values):
        self.config = dict(values)

    def log(self, values, step=None, **kwargs):
        self.records.append((step, dict(values)))

    def finish(self):
        self.finished = True


def test_jsonl_and_csv_files_hold_the_logged_values(tmp_path):
    accelerator = Accelerator(cpu=True, log_with=["jsonl", "csv"], project_dir=str(tmp_path))
    accelerator.init_trackers("run", config={"lr": 0.1, "layers": [1, 2]})
    accelerator.log({"loss": torch.tensor(0.5), "acc": 0.75}, step=3)
    accelerator.log({"loss": 0.25}, step=4)
    accelerator.end_training()
    lines = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(line["step"], line["loss"]) for line in lines] == [(3, 0.5), (4, 0.25)]
    assert lines[0]["acc"] == 0.75
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {
        "layers": [1, 2],
        "lr": 0.1,
    }
    with (tmp_path / "run" / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["step"], row["name"], row["value"]) for row in rows] == [
        ("3", "loss", "0.5"),
        ("3", "acc", "0.75"),
        ("4", "loss", "0.25"),
    ]


@pytest.mark.skipif(not tensorboard_available(), reason="needs the tensorboard extra")
def test_tensorboard_writes_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path))
    accelerator.init_trackers("tb", config={"lr": 0.1})
    for step in range(3):
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
    accelerator.end_training()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [round(e.value, 4) for e in events.Scalars("loss")] == [1.0, 0.5, 0.3333]


def test_custom_tracker_and_get_tracker():
    tracker = RecordingTracker()
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("custom", config={"a": 1})
    accelerator.log({"x": 1}, step=0)
    assert accelerator.get_tracker("recording") is tracker
    assert tracker.config == {"a": 1} and tracker.records == [(0, {"x": 1})]
    accelerator.end_training()
    assert tracker.finished
    with pytest.raises(AcceleratorConfigError, match="No tracker named"):
        Accelerator(cpu=True).get_tracker("recording")


def test_tracker_errors_name_the_fix():
    with pytest.raises(AcceleratorConfigError, match="not a known tracker"):
        resolve_trackers("wandb-typo")
    with pytest.raises(AcceleratorConfigError, match="pass project_dir"):
        Accelerator(cpu=True, log_with="jsonl")
    assert "jsonl" in resolve_trackers("all") and "csv" in resolve_trackers("all")
    # "all" leaves out the trackers that write files when there is nowhere to write them.
    assert "jsonl" not in Accelerator(cpu=True, log_with="all").log_with


class _Registered(GeneralTracker):
    name = "registered_for_test"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str, **kwargs: object) -> None:
        self.run_name, self.logging_dir, self.logged = run_name, logging_dir, []

    def log(self, values, step=None, **kwargs):
        self.logged.append((dict(values), step))


def test_a_registered_tracker_class_is_created_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "LOGGER_TYPE_TO_CLASS", dict(registry.LOGGER_TYPE_TO_CLASS))
    tracking.register_tracker_class(_Registered)
    with pytest.raises(AcceleratorConfigError, match="needs a logging_dir"):
        Accelerator(cpu=True, log_with=_Registered.name)
    accelerator = Accelerator(cpu=True, log_with=_Registered.name, project_dir=str(tmp_path))
    accelerator.init_trackers("run")
    accelerator.log({"loss": 1.0}, step=3)
    tracker = accelerator.get_tracker(_Registered.name)
    assert isinstance(tracker, _Registered) and tracker.logging_dir == str(tmp_path)
    assert tracker.run_name == "run" and tracker.logged == [({"loss": 1.0}, 3)]
    accelerator.end_training()
    with pytest.warns(UserWarning, match="already registered"):
        tracking.register_tracker_class(_Registered)
    with pytest.raises(AcceleratorConfigError, match="GeneralTracker"):
        tracking.register_tracker_class(dict)  # type: ignore[arg-type]

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    class NoFlag(GeneralTracker):
        name = "no_flag"

    with pytest.raises(AcceleratorConfigError, match="`name`"):
        tracking.register_tracker_class(Nameless)
    with pytest.raises(AcceleratorConfigError, match="requires_logging_directory"):
        tracking.register_tracker_class(NoFlag)


def _logging_in_order(path: str) -> None:
    accelerator = Accelerator()
    handler = logging.FileHandler(f"{path}.{accelerator.process_index}")
    logger = get_logger(f"test.{accelerator.process_index}", log_level="INFO")
    logger.logger.addHandler(handler)
    logger.info("main only")
    logger.info("everyone %d", accelerator.process_index, main_process_only=False)
    logger.info("ordered", in_order=True)
    handler.close()
    accelerator.end_training()


def test_logger_main_process_only_and_in_order(tmp_path):
    spawn_workers(_logging_in_order, 2, args=(str(tmp_path / "log"),), timeout=120)
    assert (tmp_path / "log.0").read_text().splitlines() == ["main only", "everyone 0", "ordered"]
    assert (tmp_path / "log.1").read_text().splitlines() == ["everyone 1", "ordered"]


def test_logger_needs_the_state():
    with pytest.raises(Exception, match="create PartialState"):
        get_logger("nostate").info("hello")


def test_find_executable_batch_size_shrinks_on_out_of_memory():
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size, label):
        tried.append(batch_size)
        if batch_size > 16:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
        return f"{label}:{batch_size}"

    assert train("ok") == "ok:15"  # x0.9 each time, as in Accelerate
    assert tried == [64, 57, 51, 45, 40, 36, 32, 28, 25, 22, 19, 17, 15]

    @find_executable_batch_size(starting_batch_size=4)
    def never_fits(batch_size):
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="no batch size from 4 down to 1 fits"):
        never_fits()

    @find_executable_batch_size(starting_batch_size=4)
    def other_error(batch_size):
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        other_error()
    with pytest.raises(TypeError, match="call it without the first argument"):
        train(32, "extra")


def test_tqdm_shows_on_local_main_only():
    Accelerator(cpu=True)
    bar = tqdm(range(3))
    assert not bar.disable
    assert list(bar) == [0, 1, 2]


def test_general_tracker_takes_accelerates_blank_argument():
    class Plain(GeneralTracker):
        name = "plain"

        def __init__(self):
            super().__init__(_blank=True)

    tracker = Plain()
    assert tracker.tracker is tracker and tracker.name == "plain"
    assert GeneralTracker().name == "general"  # the base class defines every required field
