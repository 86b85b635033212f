"""Experiment trackers: JSON lines, CSV, TensorBoard, the hosted services, and your own.

Every tracker runs on the main process only; the Accelerator creates them in ``init_trackers``.
:data:`LOGGER_TYPE_TO_CLASS` is the one registry of tracker classes by name (the built-in ones,
those of :mod:`accel.hosted_trackers` and :mod:`accel.service_trackers`, and any added with
:func:`register_tracker_class`). A tracker's package is imported when the tracker is created, so
``import accel`` imports no tracker package.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import os
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from accel.errors import AcceleratorConfigError, UnsupportedFeatureError
from accel.hosted_trackers import MLflowTracker, WandBTracker
from accel.service_trackers import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)
from accel.tracker_base import GeneralTracker, LoggerType, on_main_process
from accel.tracker_packages import (
    TRACKER_PACKAGES,
    missing_package_error,
    tracker_package_available,
)


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


#: Tracker classes by ``log_with`` name: the one registry ``init_trackers`` creates trackers from.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    LoggerType.JSONL.value: JSONLinesTracker,
    LoggerType.CSV.value: CSVTracker,
    LoggerType.TENSORBOARD.value: TensorBoardTracker,
    LoggerType.WANDB.value: WandBTracker,
    LoggerType.MLFLOW.value: MLflowTracker,
    LoggerType.COMETML.value: CometMLTracker,
    LoggerType.AIM.value: AimTracker,
    LoggerType.CLEARML.value: ClearMLTracker,
    LoggerType.DVCLIVE.value: DVCLiveTracker,
    LoggerType.SWANLAB.value: SwanLabTracker,
    LoggerType.TRACKIO.value: TrackioTracker,
}


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``log_with=tracker_class.name`` create ``tracker_class`` (register before the Accelerator).

    The class is created with ``(project_name, **init_kwargs)``, or ``(project_name, logging_dir,
    **init_kwargs)`` when its ``requires_logging_directory`` is true. A name already registered
    (a built-in one included) is replaced, with a warning.

    Raises:
        AcceleratorConfigError: ``tracker_class`` is not a ``GeneralTracker`` subclass, or lacks a
            non-empty ``name`` or a ``requires_logging_directory`` class attribute.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise AcceleratorConfigError(
            f"register_tracker_class(tracker_class={tracker_class!r}): pass a subclass of "
            "accel.tracking.GeneralTracker."
        )
    name = tracker_class.__dict__.get("name") or getattr(tracker_class, "name", None)
    if not name or name == GeneralTracker.name:
        raise AcceleratorConfigError(
            f"register_tracker_class({tracker_class.__name__}): the class needs a non-empty "
            "`name` class attribute (the log_with name), e.g. name = 'my_tracker'."
        )
    if not _defines_directory_flag(tracker_class):
        raise AcceleratorConfigError(
            f"register_tracker_class({tracker_class.__name__}): the class needs a "
            "`requires_logging_directory` class attribute: True if it writes under the "
            "Accelerator's logging_dir, else False."
        )
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"A tracker named '{name}' is already registered ({LOGGER_TYPE_TO_CLASS[name]!r}); "
            f"{tracker_class!r} replaces it.",
            UserWarning,
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _defines_directory_flag(tracker_class: type[GeneralTracker]) -> bool:
    """Whether a class below ``GeneralTracker`` sets ``requires_logging_directory``."""
    return any(
        "requires_logging_directory" in vars(klass)
        for klass in tracker_class.__mro__
        if klass is not GeneralTracker and issubclass(klass, GeneralTracker)
    )


def tracker_class(name: str) -> type[GeneralTracker]:
    """The tracker class registered as ``name`` (``"jsonl"``, ``"wandb"``...).

    Raises:
        KeyError: No tracker is registered under ``name``.
    """
    return LOGGER_TYPE_TO_CLASS[name]


def _available(name: str) -> bool:
    """Whether the tracker called ``name`` can start here (its package is installed)."""
    if name == LoggerType.TENSORBOARD.value:
        return tensorboard_available()
    if name in TRACKER_PACKAGES:
        return tracker_package_available(name)
    return True


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose package is installed here."""
    return [
        member for member in LoggerType if member is not LoggerType.ALL and _available(member.value)
    ]


def resolve_trackers(log_with: Any) -> list[str | GeneralTracker]:
    """Normalise ``log_with`` into tracker names and ready tracker objects.

    Args:
        log_with: A name, ``LoggerType``, ``GeneralTracker`` instance, ``"all"``, or a list of
            those. ``"all"`` picks every built-in tracker whose package is installed.

    Raises:
        AcceleratorConfigError: An unknown tracker name.
        UnsupportedFeatureError: A named tracker whose package is missing (the message says
            what to install).
    """
    if log_with is None:
        return []
    items: Iterable[Any] = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    resolved: list[str | GeneralTracker] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            resolved.append(item)
            continue
        name = item.value if isinstance(item, LoggerType) else str(item)
        if name not in LOGGER_TYPE_TO_CLASS:
            name = name.lower()
        if name == LoggerType.ALL.value:
            resolved.extend(
                member.value for member in get_available_trackers() if member.value not in resolved
            )
            continue
        if name not in LOGGER_TYPE_TO_CLASS:
            raise AcceleratorConfigError(
                f"log_with={item!r} is not a known tracker; use one of "
                f"{', '.join([*LOGGER_TYPE_TO_CLASS, 'all'])}, a GeneralTracker instance, or "
                "register your class with accel.tracking.register_tracker_class."
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


def check_logging_directory(
    log_with: Iterable[str | GeneralTracker], logging_dir: str | os.PathLike[str] | None
) -> None:
    """Refuse trackers that write files when no logging directory is set.

    Raises:
        AcceleratorConfigError: A tracker named in ``log_with`` needs ``logging_dir``, which is None.
    """
    if logging_dir is not None:
        return
    for entry in log_with:
        if isinstance(entry, str) and LOGGER_TYPE_TO_CLASS[entry].requires_logging_directory:
            raise AcceleratorConfigError(
                f"log_with={entry!r} writes files, so it needs a logging_dir: pass "
                "project_dir=... or project_config=ProjectConfiguration(logging_dir=...) to "
                "the Accelerator."
            )


def filter_trackers(
    log_with: Any, logging_dir: str | os.PathLike[str] | None = None
) -> list[str | GeneralTracker]:
    """The trackers ``log_with`` asks for that can run with ``logging_dir``.

    Like :func:`resolve_trackers`, and a tracker that writes files needs ``logging_dir``: one
    named explicitly is refused without it, while ``"all"`` leaves such trackers out.

    Raises:
        AcceleratorConfigError: An unknown tracker, or one named explicitly that writes files
            while ``logging_dir`` is None.
        UnsupportedFeatureError: A named tracker whose package is missing.
    """
    items: list[Any] = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    explicit = [item for item in items if item is not None and not _means_all(item)]
    check_logging_directory(resolve_trackers(explicit), logging_dir)
    resolved = resolve_trackers(items if log_with is not None else None)
    if logging_dir is not None:
        return resolved
    return [
        entry
        for entry in resolved
        if isinstance(entry, GeneralTracker)
        or not LOGGER_TYPE_TO_CLASS[entry].requires_logging_directory
    ]


def _means_all(item: Any) -> bool:
    return item is LoggerType.ALL or (
        isinstance(item, str) and item.lower() == LoggerType.ALL.value
    )


__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "CSVTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLinesTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
    "resolve_trackers",
]
