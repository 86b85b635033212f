"""Trackers writing local files: JSON lines, CSV (standard library only) and TensorBoard.

Each writes under ``<logging_dir>/<run_name>`` (``requires_logging_directory``); TensorBoard's
package is imported when its tracker is created.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import numbers
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel.errors import UnsupportedFeatureError
from accel.tracking.base import GeneralTracker
from accel.tracking.values import plain_value


def _run_directory(logging_dir: str | Path, run_name: str) -> Path:
    directory = Path(logging_dir) / run_name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


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
            json.dumps(plain_value(dict(values)), indent=2, sort_keys=True)
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
        record = {"step": step, "time": time.time(), **plain_value(dict(values))}
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
        for name, value in plain_value(dict(values)).items():
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
        plain = plain_value(dict(values))
        self.writer.add_text("config", json.dumps(plain, indent=2, sort_keys=True))
        scalars = {
            key: value for key, value in plain.items() if isinstance(value, (int, float, str, bool))
        }
        self.writer.add_hparams(scalars, metric_dict={}, run_name=".")
        self.writer.flush()

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars, text as text, dicts of numbers as grouped scalars."""
        for name, value in values.items():
            plain = plain_value(value)
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
    return importlib.util.find_spec("tensorboard") is not None
