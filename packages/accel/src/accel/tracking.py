"""Experiment trackers: JSON lines, CSV, TensorBoard, Weights & Biases, MLflow, and your own.

Every tracker runs on the main process only; the Accelerator creates them in ``init_trackers``.
``WandBTracker`` and ``MLflowTracker`` live in :mod:`accel.hosted_trackers` (loaded on first use,
so ``import accel`` imports neither wandb nor mlflow) and are reachable from here too.
"""

from __future__ import annotations

import abc
import csv
import enum
import importlib
import json
import math
import numbers
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.tracker_packages import (
    UNIMPLEMENTED_TRACKERS,
    missing_package_error,
    tracker_package_available,
    unimplemented_error,
)


class LoggerType(enum.Enum):
    """Names of the built-in trackers (``ALL`` picks every one that can run here).

    As in Accelerate, a member prints as its value (``str(LoggerType.WANDB) == "wandb"``) but is
    not a string: compare ``member.value`` (or ``str(member)``) with a tracker name.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)

    @classmethod
    def list(cls) -> list[str]:
        """Return the values of all members."""
        return [str(member) for member in cls]

    ALL = "all"
    JSONL = "jsonl"
    CSV = "csv"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    COMETML = "comet_ml"
    AIM = "aim"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"


class GeneralTracker(abc.ABC):
    """Base class of every tracker; subclass it to plug in your own.

    Subclasses set ``name`` and ``requires_logging_directory`` and implement ``log``;
    ``store_init_configuration`` and ``finish`` are optional.
    """

    name: str = "general"
    requires_logging_directory: bool = False
    main_process_only: bool = True

    @property
    def tracker(self) -> Any:
        """The underlying object (writer, run...) this tracker drives."""
        return self

    def start(self) -> None:  # noqa: B027
        """Open the run (optional): ``Accelerator.init_trackers`` calls it before storing the config.

        Override it to create the run lazily, after the process group exists; the built-in
        trackers open theirs in ``__init__`` and keep this default, which does nothing.
        """

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:  # noqa: B027
        """Record the run's hyper-parameters (optional; the default keeps nothing)."""

    @abc.abstractmethod
    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (name -> number or text) at ``step``."""

    def finish(self) -> None:  # noqa: B027
        """Flush and close (optional; the default has nothing to close)."""


def _run_directory(logging_dir: str | Path, run_name: str) -> Path:
    directory = Path(logging_dir) / run_name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _plain(value: Any) -> Any:
    """JSON-safe version of a logged value (tensors and numpy scalars become numbers)."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


class _MetricsFileTracker(GeneralTracker):
    """A tracker appending to ``<logging_dir>/<run_name>/<filename>``, with ``config.json`` beside it."""

    requires_logging_directory = True
    filename = "metrics"

    def __init__(self, run_name: str, logging_dir: str | Path) -> None:
        self.directory = _run_directory(logging_dir, run_name)
        self.path = self.directory / self.filename
        self.new_file = not self.path.exists()
        self._file = self.path.open("a", newline="", encoding="utf-8")

    @property
    def tracker(self) -> Any:
        """The open metrics file."""
        return self._file

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Write ``config.json`` beside the metrics."""
        (self.directory / "config.json").write_text(
            json.dumps(_plain(dict(values)), indent=2, sort_keys=True)
        )

    def finish(self) -> None:
        """Close the file."""
        self._file.close()


class JSONLinesTracker(_MetricsFileTracker):
    """Writes ``<logging_dir>/<run_name>/metrics.jsonl`` and ``config.json``.

    One JSON object per ``log`` call; needs nothing beyond the standard library.
    """

    name = "jsonl"
    filename = "metrics.jsonl"

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Append one JSON object with ``step``, ``time`` and the values."""
        record = {"step": step, "time": time.time(), **_plain(dict(values))}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


class CSVTracker(_MetricsFileTracker):
    """Writes ``<logging_dir>/<run_name>/metrics.csv`` in long form: ``step,name,value,time``."""

    name = "csv"
    filename = "metrics.csv"

    def __init__(self, run_name: str, logging_dir: str | Path) -> None:
        super().__init__(run_name, logging_dir)
        self._writer = csv.writer(self._file)
        if self.new_file:
            self._writer.writerow(["step", "name", "value", "time"])

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Append one row per value."""
        now = time.time()
        for name, value in _plain(dict(values)).items():
            self._writer.writerow(["" if step is None else step, name, value, now])
        self._file.flush()


class TensorBoardTracker(GeneralTracker):
    """Logs through ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package)."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | Path, **kwargs: Any) -> None:
        if not tensorboard_available():
            raise UnsupportedFeatureError(
                "log_with='tensorboard' needs the tensorboard package: pip install 'accel[tensorboard]'."
            )
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(logging_dir) / run_name
        self.writer = SummaryWriter(str(self.directory), **kwargs)

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return self.writer

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Record the hyper-parameters (scalars as hparams, everything as JSON text)."""
        plain = _plain(dict(values))
        self.writer.add_text("config", json.dumps(plain, indent=2, sort_keys=True))
        scalars = {
            key: value for key, value in plain.items() if isinstance(value, (int, float, str, bool))
        }
        self.writer.add_hparams(scalars, metric_dict={}, run_name=".")
        self.writer.flush()

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars, text as text, dicts of numbers as grouped scalars."""
        for name, value in values.items():
            plain = _plain(value)
            if isinstance(plain, numbers.Number) and not isinstance(plain, bool):
                self.writer.add_scalar(name, plain, global_step=step, **kwargs)  # type: ignore[arg-type]
            elif isinstance(plain, str):
                self.writer.add_text(name, plain, global_step=step, **kwargs)
            elif isinstance(plain, dict):
                self.writer.add_scalars(name, plain, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        """Close the writer."""
        self.writer.close()


def tensorboard_available() -> bool:
    """Whether the tensorboard package is installed."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


BUILT_IN_TRACKERS: dict[str, type[GeneralTracker]] = {
    LoggerType.JSONL.value: JSONLinesTracker,
    LoggerType.CSV.value: CSVTracker,
    LoggerType.TENSORBOARD.value: TensorBoardTracker,
}


#: Trackers whose package is imported only when they are created: name -> class in the module
#: :data:`HOSTED_TRACKERS_MODULE`, loaded by name (that module builds on this one).
HOSTED_TRACKERS = {LoggerType.WANDB.value: "WandBTracker", LoggerType.MLFLOW.value: "MLflowTracker"}
HOSTED_TRACKERS_MODULE = "accel.hosted_trackers"


def _hosted_class(class_name: str) -> type[GeneralTracker]:
    found: type[GeneralTracker] = getattr(
        importlib.import_module(HOSTED_TRACKERS_MODULE), class_name
    )
    return found


def tracker_class(name: str) -> type[GeneralTracker]:
    """The built-in tracker class called ``name`` (``"jsonl"``, ``"wandb"``...).

    Raises:
        KeyError: ``name`` is not a built-in tracker.
    """
    if name in HOSTED_TRACKERS:
        return _hosted_class(HOSTED_TRACKERS[name])
    return BUILT_IN_TRACKERS[name]


def __getattr__(name: str) -> Any:
    """``accel.tracking.WandBTracker`` and ``MLflowTracker``, as in Accelerate (loaded lazily)."""
    if name in HOSTED_TRACKERS.values():
        return _hosted_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _available(name: str) -> bool:
    """Whether the tracker called ``name`` can start here (its package is installed)."""
    if name == LoggerType.TENSORBOARD.value:
        return tensorboard_available()
    if name in HOSTED_TRACKERS:
        return tracker_package_available(name)
    return True


def resolve_trackers(log_with: Any) -> list[str | GeneralTracker]:
    """Normalise ``log_with`` into tracker names and ready tracker objects.

    Args:
        log_with: A name, ``LoggerType``, ``GeneralTracker`` instance, ``"all"``, or a list of
            those. ``"all"`` picks every built-in tracker whose package is installed.

    Raises:
        AcceleratorConfigError: An unknown tracker name.
        UnsupportedFeatureError: A named tracker whose package is missing, or one of Accelerate's
            tracker names that accel does not implement (the message says what to do).
    """
    if log_with is None:
        return []
    items: Iterable[Any] = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    resolved: list[str | GeneralTracker] = []
    known = [*BUILT_IN_TRACKERS, *HOSTED_TRACKERS]
    for item in items:
        if isinstance(item, GeneralTracker):
            resolved.append(item)
            continue
        name = item.value if isinstance(item, LoggerType) else str(item).lower()
        if name == LoggerType.ALL.value:
            resolved.extend(n for n in known if _available(n) and n not in resolved)
            continue
        if name not in known:
            if name in UNIMPLEMENTED_TRACKERS:
                raise unimplemented_error(name)
            raise AcceleratorConfigError(
                f"log_with={item!r} is not a known tracker; use one of "
                f"{', '.join([*known, 'all'])} or a GeneralTracker instance."
            )
        if not _available(name):
            if name == LoggerType.TENSORBOARD.value:
                raise UnsupportedFeatureError(
                    "log_with='tensorboard' needs the tensorboard package: "
                    "pip install 'accel[tensorboard]'."
                )
            raise missing_package_error(name)
        if name not in resolved:
            resolved.append(name)
    return resolved
