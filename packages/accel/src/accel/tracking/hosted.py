"""Trackers backed by third-party services: Weights & Biases and MLflow.

Their packages are imported when a tracker is created, never when ``accel`` is imported; a
missing package gives an error naming what to install. The trackers for the other services
Accelerate knows live in :mod:`accel.tracking.services`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel.tracking.base import GeneralTracker
from accel.tracking.packages import import_tracker_package
from accel.tracking.values import scalar, scalars

logger = logging.getLogger(__name__)


class WandBTracker(GeneralTracker):
    """Logs to a Weights & Biases run (``wandb.init(project=run_name, **kwargs)``).

    Set ``WANDB_MODE=offline`` to write the run under ``./wandb`` (or ``dir=...``) without an
    account; ``wandb sync`` uploads it later.

    Args:
        run_name: The W&B project name (``init_trackers``' ``project_name``).
        **kwargs: Passed to ``wandb.init`` (``entity``, ``name``, ``dir``, ``tags``...), from
            ``init_kwargs={"wandb": {...}}``.
    """

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        wandb = import_tracker_package("wandb")
        self.run_name = run_name
        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run."""
        return self.run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Add ``values`` to the run's config."""
        self.run.config.update(scalars(values), allow_val_change=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``; scalar tensors become numbers."""
        self.run.log(scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        """End the run (an offline run's files are complete afterwards)."""
        self.run.finish()


class MLflowTracker(GeneralTracker):
    """Logs to an MLflow run: parameters from the config, numeric values as metrics.

    Args:
        experiment_name: The MLflow experiment (``init_trackers``' ``project_name``); the
            ``MLFLOW_EXPERIMENT_NAME`` variable wins, as in Accelerate.
        logging_dir: The tracking URI or a local folder (MLflow's file store; MLflow 3 asks for
            ``MLFLOW_ALLOW_FILE_STORE=true`` to use one). Default: ``MLFLOW_TRACKING_URI`` or
            MLflow's default.
        run_id: Resume this run (``MLFLOW_RUN_ID`` wins).
        tags: Run tags (a dict, or JSON in ``MLFLOW_TAGS``).
        nested_run: Start a nested run (``MLFLOW_NESTED_RUN``).
        run_name: The run's display name.
        description: The run's description.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        mlflow = import_tracker_package("mlflow")
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name) or "Default"
        run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            tags = json.loads(tags)
        nested_env = os.environ.get("MLFLOW_NESTED_RUN")
        nested = nested_env.strip().lower() in ("1", "true", "yes") if nested_env else nested_run
        if logging_dir is not None:
            mlflow.set_tracking_uri(str(logging_dir))
        experiment = mlflow.set_experiment(experiment_name)
        self.active_run = mlflow.start_run(
            run_id=run_id,
            experiment_id=experiment.experiment_id,
            run_name=run_name,
            nested=bool(nested),
            tags=tags,
            description=description,
        )
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        """The active ``mlflow.ActiveRun``."""
        return self.active_run

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Log ``values`` as run parameters (values too long for MLflow are skipped, with a warning)."""
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params: dict[str, Any] = {}
        for key, value in values.items():
            value = scalar(value)
            if len(str(value)) > MAX_PARAM_VAL_LENGTH:
                logger.warning(
                    "mlflow: parameter %r is longer than %d characters; not logged.",
                    key,
                    MAX_PARAM_VAL_LENGTH,
                )
                continue
            params[str(key)] = value
        items = list(params.items())
        for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self._mlflow.log_params(dict(items[start : start + MAX_PARAMS_TAGS_PER_BATCH]))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log the numeric values as metrics at ``step``; others are skipped with a warning."""
        metrics: dict[str, float] = {}
        for key, value in values.items():
            value = scalar(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[key] = value
            else:
                logger.warning(
                    "mlflow: %r=%r is not a number; MLflow metrics are numeric, not logged.",
                    key,
                    value,
                )
        self._mlflow.log_metrics(metrics, step=step, **kwargs)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Store a local file with the run."""
        self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def finish(self) -> None:
        """End the run."""
        self._mlflow.end_run()
