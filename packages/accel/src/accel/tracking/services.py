"""Trackers for Comet, Aim, ClearML, DVCLive, SwanLab and Trackio.

Each imports its package when it is created, never when this module is imported: a tracker whose
package is missing imports fine and raises an error naming what to ``pip install`` only when it is
used. They follow the built-in convention: created with ``(run_name, **init_kwargs)`` (Aim also
takes the logging directory), they log on the main process only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accel.tracking.base import GeneralTracker
from accel.tracking.packages import import_tracker_package
from accel.tracking.values import is_number, scalars


class CometMLTracker(GeneralTracker):
    """Logs to a Comet experiment (``comet_ml.start(project_name=run_name, **kwargs)``).

    Args:
        run_name: The Comet project name.
        **kwargs: Passed to ``comet_ml.start`` (``comet_ml.Experiment`` before comet_ml 3.41).
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        comet_ml = import_tracker_package("comet_ml")
        self.run_name = run_name
        start = getattr(comet_ml, "start", None)
        if start is not None:
            self.writer = start(project_name=run_name, **kwargs)
        else:
            self.writer = comet_ml.Experiment(project_name=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        """The Comet experiment."""
        return self.writer

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Record ``values`` as the experiment's parameters."""
        self.writer.log_parameters(scalars(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as metrics, text as ``log_other``, dicts of numbers as grouped metrics."""
        if step is not None:
            self.writer.set_step(step)
        for key, value in scalars(values).items():
            if is_number(value):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)

    def finish(self) -> None:
        """End the experiment."""
        self.writer.end()


class AimTracker(GeneralTracker):
    """Logs to an Aim run stored in the repository at ``logging_dir``.

    Args:
        run_name: The run's name.
        logging_dir: The Aim repository folder (default: the current folder).
        **kwargs: Passed to ``aim.Run``.
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any
    ) -> None:
        aim = import_tracker_package("aim")
        self.run_name = run_name
        self.writer = aim.Run(repo=str(logging_dir or "."), **kwargs)
        self.writer.name = run_name

    @property
    def tracker(self) -> Any:
        """The ``aim.Run``."""
        return self.writer

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Store ``values`` under the run's ``hparams``."""
        self.writer["hparams"] = scalars(values)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.track(value, name=key, step=step)`` for each value."""
        for key, value in scalars(values).items():
            self.writer.track(value, name=key, step=step, **kwargs)

    def finish(self) -> None:
        """Close the run."""
        self.writer.close()


class ClearMLTracker(GeneralTracker):
    """Logs to a ClearML task (the current one if a task is already running).

    Args:
        run_name: The task name (and project name unless ``project_name`` is given).
        **kwargs: Passed to ``clearml.Task.init``.
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        clearml = import_tracker_package("clearml")
        self.run_name = run_name
        current = clearml.Task.current_task()
        self._owns_task = current is None
        if current is not None:
            self.task = current
        else:
            kwargs.setdefault("project_name", run_name)
            kwargs.setdefault("task_name", run_name)
            self.task = clearml.Task.init(**kwargs)

    @property
    def tracker(self) -> Any:
        """The ClearML task."""
        return self.task

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Connect ``values`` to the task as its configuration."""
        self.task.connect_configuration(scalars(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars (``title/series`` names split at the last ``/``), or single values."""
        reporter = self.task.get_logger()
        for key, value in scalars(values).items():
            if not is_number(value):
                continue
            if step is None:
                reporter.report_single_value(name=key, value=value, **kwargs)
                continue
            title, _, series = key.rpartition("/")
            reporter.report_scalar(
                title=title or key, series=series, value=value, iteration=step, **kwargs
            )

    def finish(self) -> None:
        """Close the task if this tracker opened it."""
        if self._owns_task:
            self.task.close()


class DVCLiveTracker(GeneralTracker):
    """Logs through ``dvclive.Live`` (the ``run_name`` is not used by DVCLive).

    Args:
        run_name: Ignored (DVCLive names experiments itself).
        live: An existing ``dvclive.Live`` to log to.
        **kwargs: Passed to ``dvclive.Live``.
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        dvclive = import_tracker_package("dvclive")
        self.run_name = run_name
        self.live = live if live is not None else dvclive.Live(**kwargs)

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live`` object."""
        return self.live

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Record ``values`` as the experiment's parameters."""
        self.live.log_params(scalars(values))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log the numeric values as metrics at ``step``, then advance DVCLive's step."""
        if step is not None:
            self.live.step = step
        for key, value in scalars(values).items():
            if is_number(value):
                self.live.log_metric(key, value, **kwargs)
        self.live.next_step()

    def finish(self) -> None:
        """End the experiment."""
        self.live.end()


class _ProjectRunTracker(GeneralTracker):
    """A tracker whose package has W&B's shape: ``init(project=...)``, ``config``, ``run.log``."""

    requires_logging_directory = False
    package = ""

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        self._module = import_tracker_package(self.package)
        self.run_name = run_name
        self.run = self._module.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        """The run."""
        return self.run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Add ``values`` to the run's config."""
        self._module.config.update(scalars(values), allow_val_change=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``; scalar tensors become numbers."""
        self.run.log(scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        """End the run."""
        self.run.finish()


class SwanLabTracker(_ProjectRunTracker):
    """Logs to a SwanLab run (``swanlab.init(project=run_name, **kwargs)``)."""

    name = "swanlab"
    package = "swanlab"


class TrackioTracker(_ProjectRunTracker):
    """Logs to a Trackio run (``trackio.init(project=run_name, **kwargs)``)."""

    name = "trackio"
    package = "trackio"

    def finish(self) -> None:
        """End the run (``trackio.finish``)."""
        self._module.finish()
